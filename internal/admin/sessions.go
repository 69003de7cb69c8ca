package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Sessions keeps sign-ins in t_admin_session, so that every replica knows
// them and a revocation holds everywhere at once.
type Sessions struct {
	DB  *sqlx.DB
	TTL time.Duration
}

// Session is a sign-in as the sessions page lists it.
type Session struct {
	ID        string    `db:"id"` // SHA-256 of the cookie and the operator's token hash: not the secret
	Operator  string    `db:"operator"`
	CreatedAt time.Time `db:"created_at"`
	ExpiresAt time.Time `db:"expires_at"`
}

// idOf is a session's key: the SHA-256 of its cookie and of the
// operator's token hash. A session is bound to the token it was opened
// with: when an operator's token changes in admin.operators (a leaked
// token rotated), the sessions opened with the old one no longer match.
func idOf(cookie string, op Operator) string {
	h := sha256.New()
	h.Write([]byte(cookie))
	h.Write([]byte{0})
	h.Write(op.hash[:])
	return hex.EncodeToString(h.Sum(nil))
}

// Create starts a session for op and returns the cookie's token.
func (s *Sessions) Create(ctx context.Context, op Operator) (string, error) {
	b := make([]byte, 32)
	rand.Read(b)
	token := hex.EncodeToString(b)
	_, err := s.DB.ExecContext(ctx, `INSERT INTO t_admin_session (id, operator, expires_at)
		VALUES (?, ?, CURRENT_TIMESTAMP(3) + INTERVAL ? SECOND)`, idOf(token, op), op.Name, int(s.TTL.Seconds()))
	return token, err
}

// errNoSession: no such session, or it expired or was revoked, or its
// operator is no longer configured with the token it signed in with.
var errNoSession = errors.New("no live session")

// Lookup returns the operator and key of the live session of cookie,
// opened by one of ops with the token ops has for it now.
func (s *Sessions) Lookup(ctx context.Context, cookie string, ops []Operator) (operator, id string, err error) {
	if len(ops) == 0 {
		return "", "", errNoSession
	}
	ids := make([]any, len(ops))
	byID := map[string]string{}
	for i, op := range ops {
		id := idOf(cookie, op)
		ids[i], byID[id] = id, op.Name
	}
	var rows []struct {
		ID       string `db:"id"`
		Operator string `db:"operator"`
	}
	err = s.DB.SelectContext(ctx, &rows, `SELECT id, operator FROM t_admin_session
		WHERE id IN (?`+strings.Repeat(", ?", len(ids)-1)+`) AND revoked_at IS NULL AND expires_at > CURRENT_TIMESTAMP(3)`, ids...)
	if err != nil {
		return "", "", err
	}
	for _, r := range rows {
		if byID[r.ID] == r.Operator {
			return r.Operator, r.ID, nil
		}
	}
	return "", "", errNoSession
}

// Revoke ends the session id (by) and reports whether it was live.
func (s *Sessions) Revoke(ctx context.Context, id, by string) (bool, error) {
	res, err := s.DB.ExecContext(ctx, `UPDATE t_admin_session SET revoked_at = CURRENT_TIMESTAMP(3), revoked_by = ?
		WHERE id = ? AND revoked_at IS NULL`, by, id)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Live lists the sessions that have not ended, newest first.
func (s *Sessions) Live(ctx context.Context) ([]Session, error) {
	var out []Session
	err := s.DB.SelectContext(ctx, &out, `SELECT id, operator, created_at, expires_at FROM t_admin_session
		WHERE revoked_at IS NULL AND expires_at > CURRENT_TIMESTAMP(3) ORDER BY created_at DESC LIMIT 200`)
	return out, err
}
