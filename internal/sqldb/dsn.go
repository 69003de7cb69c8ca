package sqldb

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// dsnRule is one DSN parameter paysvc relies on: the values it accepts
// (compared case-insensitively; absent is always fine) and why.
type dsnRule struct {
	name   string
	accept []string
	why    string
}

// dsnRules are the DSN parameters the code depends on. Open sets each of
// them itself; a DSN that asks for something else is refused rather than
// silently changed, so the operator learns what paysvc does.
var dsnRules = []dsnRule{
	{"interpolateParams", []string{"true"},
		"each payment sends its statements with their parameters in one round trip, which needs interpolateParams=true (the driver answers driver.ErrSkip otherwise and no payment can be applied)"},
	{"multiStatements", []string{"true"},
		"each payment's writes are one multi-statement"},
	{"parseTime", []string{"true"},
		"DATETIME columns are read as time.Time"},
	{"clientFoundRows", []string{"false"},
		"compare-and-swap updates are judged by the rows they changed, not the rows they matched"},
	{"loc", []string{"UTC"},
		"times are written and read as UTC"},
	{"time_zone", []string{"'+00:00'", "+00:00"},
		"DATETIME columns hold UTC, written by Go and by CURRENT_TIMESTAMP alike"},
	{"autocommit", []string{"1", "true", "on"},
		"statements outside a transaction must commit on their own"},
}

// dsnConfigured are session variables paysvc sets from its own
// configuration keys; the DSN must not set them too.
var dsnConfigured = map[string]string{
	"innodb_lock_wait_timeout":      "mysql.lockWaitTimeout",
	"idle_transaction_timeout":      "mysql.idleTransactionTimeout",
	"tidb_idle_transaction_timeout": "mysql.idleTransactionTimeout",
	"wait_timeout":                  "mysql.idleTransactionTimeout",
	"tx_isolation":                  "(none: paysvc runs READ COMMITTED)",
	"transaction_isolation":         "(none: paysvc runs READ COMMITTED)",
	"tidb_txn_mode":                 "(none: paysvc runs pessimistic transactions on TiDB)",
}

// dsnParams returns the parameters written in dsn's query part, as written
// (ParseDSN cannot tell an explicit interpolateParams=false from its
// absence). The query starts at the first '?' after the last '/': the
// password and the address may hold either character.
func dsnParams(dsn string) (map[string]string, error) {
	slash := strings.LastIndex(dsn, "/")
	if slash < 0 {
		return nil, errors.New("no '/' before the database name")
	}
	_, query, ok := strings.Cut(dsn[slash:], "?")
	out := map[string]string{}
	if !ok {
		return out, nil
	}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		out[k] = v
	}
	return out, nil
}

// CheckDSN reports every parameter of dsn that would change what paysvc
// relies on, naming it and saying why; nil if there is none.
func CheckDSN(dsn string) error {
	params, err := dsnParams(dsn)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range dsnRules {
		v, ok := params[r.name]
		if ok && !slices.ContainsFunc(r.accept, func(a string) bool { return strings.EqualFold(a, v) }) {
			errs = append(errs, fmt.Errorf("%s=%s is not supported: %s; remove it (paysvc sets %s=%s)",
				r.name, v, r.why, r.name, r.accept[0]))
		}
	}
	names := make([]string, 0, len(dsnConfigured))
	for name := range dsnConfigured {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, ok := params[name]; ok {
			errs = append(errs, fmt.Errorf("%s: paysvc sets this session variable itself; remove it from the DSN (configure %s)",
				name, dsnConfigured[name]))
		}
	}
	if mode, ok := params["sql_mode"]; ok && !strictMode(mode) {
		errs = append(errs, fmt.Errorf("sql_mode=%s is not strict: an oversized or out-of-range value would be cut silently; include STRICT_TRANS_TABLES", mode))
	}
	return errors.Join(errs...)
}

func strictMode(mode string) bool {
	m := strings.ToUpper(mode)
	return strings.Contains(m, "STRICT_TRANS_TABLES") || strings.Contains(m, "STRICT_ALL_TABLES")
}
