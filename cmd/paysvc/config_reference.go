package main

import (
	"fmt"
	"strings"
)

// The configuration reference: a Markdown table rendered from keys, kept
// between these markers in docs/configuration.md (and in any other file
// that has them, such as README.md). TestConfigReferenceUpToDate fails when
// a file is out of date; this rewrites them (make docs does the same):
//
//go:generate go test -count=1 -run ^TestConfigReferenceUpToDate$ . -args -update
const (
	referenceBegin = "<!-- config-reference:begin -->"
	referenceEnd   = "<!-- config-reference:end -->"
)

// configReference renders every key: name, default, environment variable,
// whether it is secret, description.
func configReference() string {
	var b strings.Builder
	b.WriteString("| key | default | environment variable | secret | description |\n")
	b.WriteString("|---|---|---|---|---|\n")
	for _, k := range keys {
		def := "empty"
		if k.def != "" {
			def = "`" + k.def + "`"
		}
		secret := ""
		switch {
		case k.secret:
			secret = "yes"
		case k.redact != nil:
			secret = "its password"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s |\n",
			k.name, def, envName(k.name), secret, strings.ReplaceAll(k.doc, "|", `\|`))
	}
	return b.String()
}

// withConfigReference returns text with what lies between the markers
// replaced by the current reference; found is false when text has no
// markers (text is returned as it is).
func withConfigReference(text string) (out string, found bool, err error) {
	begin := strings.Index(text, referenceBegin)
	end := strings.Index(text, referenceEnd)
	switch {
	case begin < 0 && end < 0:
		return text, false, nil
	case begin < 0 || end < begin:
		return "", false, fmt.Errorf("want %s, then %s", referenceBegin, referenceEnd)
	}
	block := referenceBegin + "\n" +
		"<!-- Generated from the declarations in cmd/paysvc/config_keys.go: edit them, then run make docs. -->\n\n" +
		configReference() + "\n"
	return text[:begin] + block + text[end:], true, nil
}
