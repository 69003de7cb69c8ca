// Package deadletter keeps terminal messages durably for audit and replay:
// one row per distinct terminal payment (order number, user and amount; or
// per body, when the message is not a valid payment), so that every
// different message stays recoverable with its own body, class and history,
// while copies of one payment share a row. A row's status is NEW, REPLAYED
// or DISCARDED, with every parking, replay and discard kept as an event.
// One order number can have several rows.
package deadletter

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Status is a dead letter's state.
type Status string

// The closed set of states.
const (
	New       Status = "NEW"
	Replayed  Status = "REPLAYED"
	Discarded Status = "DISCARDED"
)

// Events in a dead letter's history.
const (
	EventParked       = "PARKED"
	EventReplayed     = "REPLAYED"
	EventReplayFailed = "REPLAY_FAILED"
	EventDiscarded    = "DISCARDED"
)

var (
	// ErrNotFound: no dead letter with that id or order number.
	ErrNotFound = errors.New("dead letter not found")
	// ErrWrongStatus: the operation does not apply in the row's status.
	ErrWrongStatus = errors.New("dead letter status does not allow this")
	// ErrBadInput: an operator name or reason the audit columns cannot
	// hold (longer than they are, or not UTF-8).
	ErrBadInput = errors.New("not a valid operator or reason")
)

// Parked is a terminal message as it arrives.
type Parked struct {
	OrderNo       string       // "" when the body has no usable order number
	UserID        *int64       // nil when unknown
	Amount        *money.Cents // nil when unknown
	Body          []byte
	Headers       string // JSON of the AMQP headers
	TraceID       string // the W3C trace id of the message, "" when it had none
	ErrorClass    string
	LastError     string
	RetryCount    int
	FirstFailedAt time.Time
	LastFailedAt  time.Time
}

// DeadLetter is a stored terminal message.
type DeadLetter struct {
	ID            int64        `db:"id"`
	OrderNo       *string      `db:"order_no"`
	UserID        *int64       `db:"user_id"`
	Amount        *money.Cents `db:"amount"`
	Body          []byte       `db:"body"`
	Headers       string       `db:"headers"`
	TraceID       string       `db:"trace_id"`
	ErrorClass    string       `db:"error_class"`
	LastError     string       `db:"last_error"`
	RetryCount    int          `db:"retry_count"`
	ParkedCount   int          `db:"parked_count"`
	FirstFailedAt time.Time    `db:"first_failed_at"`
	LastFailedAt  time.Time    `db:"last_failed_at"`
	Status        Status       `db:"status"`
	UpdatedBy     string       `db:"updated_by"`
	Reason        string       `db:"reason"`
	AlertedAt     *time.Time   `db:"alerted_at"`
}

// Order returns the order number, or "".
func (d DeadLetter) Order() string {
	if d.OrderNo == nil {
		return ""
	}
	return *d.OrderNo
}

// Event is one step of a dead letter's history.
type Event struct {
	ID         int64     `db:"id"`
	Event      string    `db:"event"`
	Operator   string    `db:"operator"`
	Reason     string    `db:"reason"`
	Result     string    `db:"result"`
	ErrorClass string    `db:"error_class"`
	RetryCount int       `db:"retry_count"`
	At         time.Time `db:"create_time"`
}

// Store reads and writes dead letters.
type Store struct{ db *sqlx.DB }

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB) *Store { return &Store{db: db} }

const columns = `id, order_no, user_id, amount, body, headers, trace_id, error_class, last_error, retry_count,
	parked_count, first_failed_at, last_failed_at, status, updated_by, reason, alerted_at`

// dedupKey files p: copies of one payment (order number, user and amount)
// share a key; anything else is filed by its body. Migration 0004 computes
// the same keys in SQL: keep the two equal.
func dedupKey(p Parked) string {
	if p.OrderNo != "" && p.UserID != nil && p.Amount != nil {
		sum := sha256.Sum256([]byte(p.OrderNo + "|" + strconv.FormatInt(*p.UserID, 10) + "|" + p.Amount.String()))
		return "pay:" + hex.EncodeToString(sum[:])
	}
	sum := sha256.Sum256(p.Body)
	return "body:" + hex.EncodeToString(sum[:])
}

func fingerprint(p Parked) string {
	h := sha256.New()
	h.Write(p.Body)
	fmt.Fprintf(h, "\x00%s\x00%d\x00%s", p.ErrorClass, p.RetryCount, p.LastFailedAt.UTC().Format(time.RFC3339Nano))
	return hex.EncodeToString(h.Sum(nil))
}

// Park stores a terminal message: a new row, or, for an order already parked,
// the same row updated and back to NEW with the parking added to its history.
// A redelivery of the very same terminal message changes nothing. It reports
// whether the row became NEW now (an alert is due), and the row id.
//
// What does not fit a column is cut to fit, and LastError says so: a
// message that cannot be stored as it came must still be stored.
func (s *Store) Park(ctx context.Context, p Parked) (id int64, becameNew bool, err error) {
	key, fp := dedupKey(p), fingerprint(p)
	p = fit(p)
	var orderNo *string
	if p.OrderNo != "" {
		orderNo = &p.OrderNo
	}
	for attempt := 1; ; attempt++ {
		err = sqldb.InTx(ctx, s.db, func(tx *sqldb.Tx) error {
			var cur struct {
				ID          int64  `db:"id"`
				Status      Status `db:"status"`
				Fingerprint string `db:"fingerprint"`
			}
			err := tx.GetContext(ctx, &cur, "SELECT id, status, fingerprint FROM t_dead_letter WHERE dedup_key = ? FOR UPDATE", key)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				res, err := tx.ExecContext(ctx, `INSERT INTO t_dead_letter (dedup_key, order_no, user_id, amount, body, headers,
					trace_id, error_class, last_error, retry_count, fingerprint, first_failed_at, last_failed_at)
					VALUES (?, ?, ?, CAST(? AS DECIMAL(18,2)), ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
					key, orderNo, p.UserID, p.Amount, p.Body, p.Headers, p.TraceID, p.ErrorClass, p.LastError, p.RetryCount, fp,
					p.FirstFailedAt.UTC(), p.LastFailedAt.UTC())
				if err != nil {
					return err
				}
				id, _ = res.LastInsertId()
				becameNew = true
			case err != nil:
				return err
			case cur.Fingerprint == fp:
				id, becameNew = cur.ID, false
				return nil // the same terminal message delivered again
			default:
				id, becameNew = cur.ID, cur.Status != New
				_, err = tx.ExecContext(ctx, `UPDATE t_dead_letter SET order_no = ?, user_id = ?, amount = CAST(? AS DECIMAL(18,2)),
					body = ?, headers = ?, trace_id = ?, error_class = ?, last_error = ?, retry_count = ?, fingerprint = ?,
					parked_count = parked_count + 1, first_failed_at = LEAST(first_failed_at, ?), last_failed_at = ?,
					alerted_at = CASE WHEN status = 'NEW' THEN alerted_at ELSE NULL END,
					status = 'NEW', updated_by = 'paysvc', reason = ''
					WHERE id = ?`, // MySQL assigns left to right: alerted_at reads the old status
					orderNo, p.UserID, p.Amount, p.Body, p.Headers, p.TraceID, p.ErrorClass, p.LastError, p.RetryCount, fp,
					p.FirstFailedAt.UTC(), p.LastFailedAt.UTC(), id)
				if err != nil {
					return err
				}
			}
			return addEvent(ctx, tx, id, EventParked, "paysvc", "", p.LastError, p.ErrorClass, p.RetryCount)
		})
		if err == nil || attempt >= 3 || !(sqldb.IsDeadlock(err) || sqldb.IsDuplicateKey(err)) {
			break
		}
	}
	if err != nil {
		return 0, false, fmt.Errorf("park %s: %w", key, err)
	}
	return id, becameNew, nil
}

func addEvent(ctx context.Context, tx sqlx.ExecerContext, id int64, event, operator, reason, result, class string, retries int) error {
	if len(result) > 4000 {
		result = result[:4000]
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO t_dead_letter_event (dead_letter_id, event, operator, reason, result, error_class, retry_count)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, id, event, operator, reason, result, class, retries)
	return err
}

// Filter selects dead letters for List.
type Filter struct {
	OrderNo string
	Class   string
	Status  Status
	Since   time.Time // last failed at or after
	Limit   int       // 0: 100
}

// List returns dead letters matching f, newest failure first.
func (s *Store) List(ctx context.Context, f Filter) ([]DeadLetter, error) {
	q := "SELECT " + columns + " FROM t_dead_letter WHERE 1 = 1"
	var args []any
	if f.OrderNo != "" {
		q += " AND order_no = ?"
		args = append(args, f.OrderNo)
	}
	if f.Class != "" {
		q += " AND error_class = ?"
		args = append(args, f.Class)
	}
	if f.Status != "" {
		q += " AND status = ?"
		args = append(args, f.Status)
	}
	if !f.Since.IsZero() {
		q += " AND last_failed_at >= ?"
		args = append(args, f.Since.UTC())
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	q += " ORDER BY last_failed_at DESC, id DESC LIMIT ?"
	args = append(args, f.Limit)
	var out []DeadLetter
	if err := s.db.SelectContext(ctx, &out, q, args...); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// Get returns the dead letter with id, with its history.
func (s *Store) Get(ctx context.Context, id int64) (DeadLetter, []Event, error) {
	var d DeadLetter
	err := s.db.GetContext(ctx, &d, "SELECT "+columns+" FROM t_dead_letter WHERE id = ?", id)
	if errors.Is(err, sql.ErrNoRows) {
		return d, nil, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return d, nil, fmt.Errorf("dead letter %d: %w", id, err)
	}
	var evs []Event
	err = s.db.SelectContext(ctx, &evs, `SELECT id, event, operator, reason, result, error_class, retry_count, create_time
		FROM t_dead_letter_event WHERE dead_letter_id = ? ORDER BY id`, d.ID)
	return d, evs, err
}

// ByOrder returns every dead letter of an order number, oldest first; none
// is ErrNotFound.
func (s *Store) ByOrder(ctx context.Context, orderNo string) ([]DeadLetter, error) {
	var out []DeadLetter
	if err := s.db.SelectContext(ctx, &out, "SELECT "+columns+" FROM t_dead_letter WHERE order_no = ? ORDER BY id", orderNo); err != nil {
		return nil, fmt.Errorf("dead letters of order %s: %w", orderNo, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("order %s: %w", orderNo, ErrNotFound)
	}
	return out, nil
}

// ErrAmbiguous: an all-digit reference that could be an order number or a
// dead letter id.
var ErrAmbiguous = errors.New("ambiguous dead letter reference")

// FindOrder resolves an order number typed by a person. Order numbers may
// be all digits, and so may row ids: an all-digit argument that names no
// order but is a row id, or names both, is refused with ErrAmbiguous and a
// message saying how to name either (--id, --order), never guessed.
// explicit says the caller already knows it is an order number.
func (s *Store) FindOrder(ctx context.Context, ref string, explicit bool) ([]DeadLetter, error) {
	rows, err := s.ByOrder(ctx, ref)
	if explicit || !allDigits(ref) || (err != nil && !errors.Is(err, ErrNotFound)) {
		return rows, err
	}
	id, _ := strconv.ParseInt(ref, 10, 64)
	var n int
	if qerr := s.db.GetContext(ctx, &n, "SELECT COUNT(*) FROM t_dead_letter WHERE id = ?", id); qerr != nil {
		return nil, fmt.Errorf("dead letter %s: %w", ref, qerr)
	}
	switch {
	case n == 0:
		return rows, err
	case err == nil:
		return nil, fmt.Errorf("%w: %s is an order number with dead letters and also a dead letter id: say --order %s or --id %s",
			ErrAmbiguous, ref, ref, ref)
	}
	return nil, fmt.Errorf("%w: no dead letter has order number %s, but dead letter id %s exists: say --id %s",
		ErrAmbiguous, ref, ref, ref)
}

// ErrSeveral: an order has more than one dead letter an operation applies to.
var ErrSeveral = errors.New("several dead letters")

// Choose narrows an order's rows to those an operation applies to: those
// in the first of statuses that any row is in (so NEW rows are preferred to
// DISCARDED ones for a replay). When no row is in any, all rows are
// returned, for the operation to say why it skips them. More than one
// candidate is ErrSeveral, listing them, unless all is set; allFlag names
// the option that sets it.
func Choose(orderNo string, rows []DeadLetter, all bool, allFlag string, statuses ...Status) ([]DeadLetter, error) {
	var candidates []DeadLetter
	for _, st := range statuses {
		for _, d := range rows {
			if d.Status == st {
				candidates = append(candidates, d)
			}
		}
		if len(candidates) > 0 {
			break
		}
	}
	switch {
	case len(candidates) == 0:
		return rows, nil
	case len(candidates) == 1 || all:
		return candidates, nil
	}
	var list []string
	for _, d := range candidates {
		amount := "?"
		if d.Amount != nil {
			amount = d.Amount.String()
		}
		list = append(list, fmt.Sprintf("id %d (%s, amount %s, %s)", d.ID, d.ErrorClass, amount, d.Status))
	}
	return nil, fmt.Errorf("%w: order %s has %d: %s; name one with --id, or take all with %s",
		ErrSeveral, orderNo, len(candidates), strings.Join(list, ", "), allFlag)
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// ErrChanged: the dead letter is not as the caller read it any more
// (another operator discarded or replayed it, or it was parked again).
var ErrChanged = errors.New("changed since it was read")

// Replay publishes d's copy with publish and marks d REPLAYED, with an
// audit event, in one transaction that holds the row from its check to its
// mark. The row must still be as d has it (the same status, NEW or
// DISCARDED, and the same parked count): otherwise nothing is published
// and the error wraps ErrChanged (or ErrWrongStatus). Holding the row
// orders a re-parking of the published copy after the mark: the copy finds
// the row REPLAYED and makes it NEW again, with its alert, and never the
// other way round. If the mark is not committed after a publish, the copy
// is on its way and the row keeps its status: replayed again, the copy is
// answered as a duplicate.
func (s *Store) Replay(ctx context.Context, d DeadLetter, operator, reason, result string, publish func(context.Context) error) error {
	asRead := func(st Status, parked int) error {
		switch {
		case st != New && st != Discarded:
			return fmt.Errorf("dead letter %d is %s: %w", d.ID, st, ErrWrongStatus)
		case st != d.Status || parked != d.ParkedCount:
			return fmt.Errorf("dead letter %d: %w (read %s, parked %d times; now %s, parked %d times)",
				d.ID, ErrChanged, d.Status, d.ParkedCount, st, parked)
		}
		return nil
	}
	return s.transition(ctx, d.ID, Replayed, asRead, publish, EventReplayed, operator, reason, result)
}

// MarkDiscarded discards dead letter d, with an audit event. It must be
// NEW, and still as d has it (parked as many times): a row replayed and
// parked again since it was read failed anew, which its reader never saw,
// and the error wraps ErrChanged.
func (s *Store) MarkDiscarded(ctx context.Context, d DeadLetter, operator, reason string) error {
	asRead := func(st Status, parked int) error {
		switch {
		case st != New:
			return fmt.Errorf("dead letter %d is %s: %w", d.ID, st, ErrWrongStatus)
		case st != d.Status || parked != d.ParkedCount:
			return fmt.Errorf("dead letter %d: %w (read %s, parked %d times; now %s, parked %d times)",
				d.ID, ErrChanged, d.Status, d.ParkedCount, st, parked)
		}
		return nil
	}
	return s.transition(ctx, d.ID, Discarded, asRead, nil, EventDiscarded, operator, reason, "discarded")
}

// RecordFailure writes an audit event for a replay that did not happen.
func (s *Store) RecordFailure(ctx context.Context, id int64, operator, reason, result string) error {
	return addEvent(ctx, s.db, id, EventReplayFailed, operator, reason, result, "", 0)
}

// Audit columns' sizes (t_dead_letter, t_dead_letter_event), in characters.
const (
	maxOperator = 64
	maxReason   = 255
)

// CheckAudit refuses an operator name or a reason the audit columns cannot
// hold: too long, or not UTF-8. Callers check before they act; the store
// checks again before any publish.
func CheckAudit(operator, reason string) error {
	switch {
	case !utf8.ValidString(operator) || !utf8.ValidString(reason):
		return fmt.Errorf("%w: not UTF-8", ErrBadInput)
	case utf8.RuneCountInString(operator) > maxOperator:
		return fmt.Errorf("%w: the operator name has %d characters, at most %d", ErrBadInput, utf8.RuneCountInString(operator), maxOperator)
	case utf8.RuneCountInString(reason) > maxReason:
		return fmt.Errorf("%w: the reason has %d characters, at most %d", ErrBadInput, utf8.RuneCountInString(reason), maxReason)
	}
	return nil
}

// transition moves dead letter id to status to, with an audit event, in
// one transaction that holds the row from allowed's check of its status
// and parked count to the commit; during, if not nil, runs after the
// update and the event are written (a replay's publish: a row the
// database refuses to mark is never published) and its error rolls
// everything back.
func (s *Store) transition(ctx context.Context, id int64, to Status, allowed func(st Status, parked int) error,
	during func(context.Context) error, event, operator, reason, result string) error {
	if err := CheckAudit(operator, reason); err != nil {
		return err
	}
	return sqldb.InTx(ctx, s.db, func(tx *sqldb.Tx) error {
		var row struct {
			Status      Status `db:"status"`
			ParkedCount int    `db:"parked_count"`
		}
		err := tx.GetContext(ctx, &row, "SELECT status, parked_count FROM t_dead_letter WHERE id = ? FOR UPDATE", id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := allowed(row.Status, row.ParkedCount); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE t_dead_letter SET status = ?, updated_by = ?, reason = ? WHERE id = ?",
			to, operator, reason, id); err != nil {
			return err
		}
		if err := addEvent(ctx, tx, id, event, operator, reason, result, "", 0); err != nil {
			return err
		}
		if during != nil {
			return during(ctx)
		}
		return nil
	})
}

// PendingAlerts returns NEW dead letters whose alert is not sent yet.
func (s *Store) PendingAlerts(ctx context.Context, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := s.db.SelectContext(ctx, &out, "SELECT "+columns+
		" FROM t_dead_letter WHERE status = 'NEW' AND alerted_at IS NULL ORDER BY id LIMIT ?", limit)
	return out, err
}

// MarkAlerted records that the alert for the dead letter d, as read, was
// delivered. A row parked again since (replayed, failed again: a new
// failure, not yet alerted) is left unmarked for the next alert; so is a
// row another copy of the payment was parked on meanwhile (alerted twice,
// rather than a failure never).
func (s *Store) MarkAlerted(ctx context.Context, d DeadLetter) error {
	_, err := s.db.ExecContext(ctx, "UPDATE t_dead_letter SET alerted_at = CURRENT_TIMESTAMP(3) "+
		"WHERE id = ? AND parked_count = ? AND alerted_at IS NULL", d.ID, d.ParkedCount)
	return err
}

// Stats are the numbers metrics need: NEW rows and the oldest NEW failure.
func (s *Store) Stats(ctx context.Context) (newCount int, oldest time.Time, err error) {
	var row struct {
		N      int        `db:"n"`
		Oldest *time.Time `db:"oldest"`
	}
	err = s.db.GetContext(ctx, &row, "SELECT COUNT(*) AS n, MIN(first_failed_at) AS oldest FROM t_dead_letter WHERE status = 'NEW'")
	if row.Oldest != nil {
		oldest = *row.Oldest
	}
	return row.N, oldest, err
}

// DayCount is how many dead letters first failed on a day (UTC).
type DayCount struct {
	Day time.Time
	N   int
}

// PerDay counts the dead letters by the day they first failed, for the
// last days days up to now (every day, zero or not).
func (s *Store) PerDay(ctx context.Context, days int, now time.Time) ([]DayCount, error) {
	first := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -(days - 1))
	var rows []struct {
		Day string `db:"day"`
		N   int    `db:"n"`
	}
	if err := s.db.SelectContext(ctx, &rows, `SELECT DATE_FORMAT(first_failed_at, '%Y-%m-%d') AS day, COUNT(*) AS n
		FROM t_dead_letter WHERE first_failed_at >= ? GROUP BY day`, first); err != nil {
		return nil, err
	}
	byDay := map[string]int{}
	for _, r := range rows {
		byDay[r.Day] = r.N
	}
	out := make([]DayCount, days)
	for i := range out {
		d := first.AddDate(0, 0, i)
		out[i] = DayCount{Day: d, N: byDay[d.Format("2006-01-02")]}
	}
	return out, nil
}

// NewByClass counts the dead letters in status NEW by error class.
func (s *Store) NewByClass(ctx context.Context) (map[string]int, error) {
	var rows []struct {
		Class string `db:"error_class"`
		N     int    `db:"n"`
	}
	if err := s.db.SelectContext(ctx, &rows, "SELECT error_class, COUNT(*) AS n FROM t_dead_letter WHERE status = 'NEW' GROUP BY error_class"); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.Class] = r.N
	}
	return out, nil
}

// Column sizes of t_dead_letter (bytes), and what one INSERT can carry.
const (
	// The body column is a MEDIUMBLOB (16 MiB), but the row goes in one
	// statement, one packet, where an escaped body can take twice its size:
	// a body near 16 MiB passed MariaDB's default max_allowed_packet (16
	// MiB), the insert failed every time, and the parker held that message
	// and every one behind it for good. A payment is 64 KiB at most (a
	// larger one is a bad message): 4 MiB keeps any body worth reading.
	maxBody      = 4 << 20
	maxHeaders   = 1<<16 - 1 // TEXT
	maxLastError = 60000     // TEXT, with room for what fit adds
	maxClass     = 32        // VARCHAR(32), ASCII
)

// fit cuts what would not fit its column, keeping the headers valid JSON
// (the largest values are replaced first), and says so in LastError.
func fit(p Parked) Parked {
	var notes []string
	// Header strings come from any producer: the utf8mb4 columns refuse
	// bytes that are not UTF-8.
	p.ErrorClass = strings.ToValidUTF8(p.ErrorClass, "?")
	p.LastError = strings.ToValidUTF8(p.LastError, "?")
	if len(p.Headers) > maxHeaders {
		was := len(p.Headers)
		p.Headers = fitHeaders(p.Headers, maxHeaders)
		notes = append(notes, fmt.Sprintf("headers cut from %d to %d bytes", was, len(p.Headers)))
	}
	if len(p.Body) > maxBody {
		notes = append(notes, fmt.Sprintf("body cut from %d to %d bytes", len(p.Body), maxBody))
		p.Body = p.Body[:maxBody]
	}
	if len(p.ErrorClass) > maxClass {
		notes = append(notes, fmt.Sprintf("error class %.60q cut", p.ErrorClass))
		p.ErrorClass = clip(p.ErrorClass, maxClass)
	}
	if len(p.LastError) > maxLastError {
		p.LastError = clip(p.LastError, maxLastError) + "..."
	}
	if len(notes) > 0 {
		p.LastError += " [paysvc: " + strings.Join(notes, "; ") + " to fit t_dead_letter]"
	}
	return p
}

// fitHeaders shrinks a JSON object of headers under limit bytes by
// replacing its largest values with a note, one at a time; a body that is
// not an object, or still too long, becomes a note alone.
func fitHeaders(headers string, limit int) string {
	var m map[string]any
	if json.Unmarshal([]byte(headers), &m) == nil {
		for {
			b, _ := json.Marshal(m)
			if len(b) <= limit {
				return string(b)
			}
			biggest, size := "", 0
			for k, v := range m {
				vb, _ := json.Marshal(v)
				if _, isNote := v.(droppedNote); !isNote && len(vb) > size {
					biggest, size = k, len(vb)
				}
			}
			if biggest == "" {
				break
			}
			m[biggest] = droppedNote(fmt.Sprintf("(dropped by paysvc: %d bytes)", size))
		}
	}
	b, _ := json.Marshal(map[string]string{"x-paysvc-headers": fmt.Sprintf("(dropped by paysvc: %d bytes)", len(headers))})
	return string(b)
}

// droppedNote replaces a header value that did not fit.
type droppedNote string

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
