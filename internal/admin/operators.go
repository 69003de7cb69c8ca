package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Operator is a person allowed on the admin pages, known by name: the name
// the audit trail records for what they replay or discard.
type Operator struct {
	Name string
	hash [32]byte // SHA-256 of the token
}

// MinToken is the shortest token accepted.
const MinToken = 16

var operatorName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// placeholders are what example files put where a token goes.
var placeholders = regexp.MustCompile(`(?i)change[-_ ]?me|placeholder|example|xxxx|secret-here|your[-_ ]?token`)

// Placeholder says whether token looks like an example value
// (secret.example.yaml's CHANGE-ME-..., "changeme", "your-token"...).
func Placeholder(token string) bool { return placeholders.MatchString(token) }

// ParseOperators reads admin.operators: entries separated by commas or
// newlines, each NAME:TOKEN (16+ characters) or NAME:sha256:HEX (the
// SHA-256 of the token, so the secret need not hold the token itself).
// Names are unique; placeholder tokens are refused.
func ParseOperators(spec string) ([]Operator, error) {
	var out []Operator
	seen := map[string]bool{}
	for _, entry := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == '\n' }) {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, cred, ok := strings.Cut(entry, ":")
		if !ok || !operatorName.MatchString(name) {
			return nil, fmt.Errorf("an entry is not NAME:TOKEN or NAME:sha256:HEX (names: letters, digits, . _ @ -)")
		}
		if seen[name] {
			return nil, fmt.Errorf("operator %q is listed twice", name)
		}
		seen[name] = true
		op := Operator{Name: name}
		if h, hashed := strings.CutPrefix(cred, "sha256:"); hashed {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != 32 {
				return nil, fmt.Errorf("operator %q: sha256: wants 64 hex digits", name)
			}
			copy(op.hash[:], b)
		} else {
			if len(cred) < MinToken {
				return nil, fmt.Errorf("operator %q: the token is shorter than %d characters", name, MinToken)
			}
			if Placeholder(cred) {
				return nil, fmt.Errorf("operator %q: the token is a placeholder from an example: set a real one", name)
			}
			op.hash = sha256.Sum256([]byte(cred))
		}
		out = append(out, op)
	}
	return out, nil
}

// NewOperator is an operator whose token is token.
func NewOperator(name, token string) Operator {
	return Operator{Name: name, hash: sha256.Sum256([]byte(token))}
}

// identify returns the operator whose token this is. Every operator is
// compared, in constant time, whatever matches first.
func identify(ops []Operator, token string) (Operator, bool) {
	sum := sha256.Sum256([]byte(token))
	var found Operator
	for _, op := range ops {
		if subtle.ConstantTimeCompare(sum[:], op.hash[:]) == 1 {
			found = op
		}
	}
	return found, found.Name != ""
}
