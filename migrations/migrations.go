// Package migrations embeds the SQL schema migrations, applied in file-name
// order by `paysvc migrate`.
package migrations

import "embed"

// FS holds the NNNN_name.sql files.
//
//go:embed *.sql
var FS embed.FS
