// Command paysvc applies "payment succeeded" messages from RabbitMQ exactly
// once. Usage (paysvc help for all of it, paysvc COMMAND -h for a command's
// flags):
//
//	paysvc [--config FILE] migrate   apply the embedded schema migrations
//	paysvc [--config FILE] run       run the consumer daemon
//	paysvc dlq list|show|replay|discard ...   inspect and replay terminal messages
//	paysvc reconcile [--fix]         check money rows, find lost payments; repair both
//	paysvc prune [--dry-run]         delete rows past their retention windows
//	paysvc trace ORDER_NO            what happened to one order
//	paysvc healthcheck               ask this host's paysvc for /healthz
//	paysvc version                   print the version
//
// dlq list, dlq show and reconcile print JSON with --output json. Exit
// status: 0 done, 1 failed, 2 reconcile found problems, 64 usage error.
// The commands are a table (cli.go), one file per group (cmd_*.go).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// version is the release, from the VERSION file: make and the image build
// stamp it (-ldflags "-X main.version=1.2.3"); "dev" in a plain go build.
var version = "dev"

// revision is the VCS revision of the source, -dirty when built with
// uncommitted changes, stamped by make and the image build
// (-X main.revision=...); empty: read from the Go build info.
var revision = ""

func main() {
	if c, err := parseCommand(os.Args[1:]); err == nil && c.spec != nil && c.spec.name == "run" {
		applyMemoryLimit()
	}
	if err := run(context.Background(), os.Args[1:], os.Environ(), os.Stdout); err != nil {
		var exit *exitError
		isExit := errors.As(err, &exit)
		if !isExit || !exit.logged {
			// The commands meant for people (dlq, reconcile, trace) say it
			// in plain text; the daemon has logged it already.
			fmt.Fprintf(os.Stderr, "paysvc: %v\n", err)
		}
		if isExit && exit.usage != "" {
			fmt.Fprintf(os.Stderr, "\n%s", exit.usage)
		}
		if isExit {
			os.Exit(exit.code)
		}
		os.Exit(exitFailure)
	}
}
