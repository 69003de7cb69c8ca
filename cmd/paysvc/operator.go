package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// The operator commands (dlq, reconcile, trace) share these: opening the
// database, who the operator is, their flags and how they print.

// openForOperator loads the configuration and opens the database for an
// operator command. checkSchema: the schema must be complete (every command
// but reconcile, which must run on legacy data before the unique index can
// be added).
func (c *cmdLine) openForOperator(ctx context.Context, checkSchema bool) (*Config, *sqldb.DB, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, nil, err
	}
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return nil, nil, err
	}
	db, err := sqldb.Open(ctx, dsn, 4)
	if err != nil {
		return nil, nil, err
	}
	if checkSchema {
		ms, err := sqldb.LoadMigrations(migrations.FS)
		if err == nil {
			err = sqldb.CheckSchema(ctx, db, ms)
		}
		if err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	return cfg, db, nil
}

// operator is who runs a command that changes something: --operator, else
// $USER, else "cli".
func (c *cmdLine) operator(flagValue string) string {
	for _, s := range []string{flagValue, c.env["USER"]} {
		if s != "" {
			return s
		}
	}
	return "cli"
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// idsFlag is a repeatable --id N.
type idsFlag []int64

func (m *idsFlag) String() string {
	s := make([]string, len(*m))
	for i, id := range *m {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

func (m *idsFlag) Set(v string) error {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return errors.New("want a number")
	}
	*m = append(*m, id)
	return nil
}

// outputFormat is --output: table (for people, the default) or json (for
// scripts).
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }

func (o *outputFormat) Set(v string) error {
	if v != "table" && v != "json" {
		return errors.New("want table or json")
	}
	*o = outputFormat(v)
	return nil
}

func outputFlag(fs *flag.FlagSet) *outputFormat {
	o := outputFormat("table")
	fs.Var(&o, "output", "`FORMAT` table (for people) or json (for scripts: the fields are described above)")
	return &o
}

// writeJSON writes v indented, as --output json does.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// rfc3339 is how every command prints a time: UTC, to the second.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// orNull is s, or JSON null for "".
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
