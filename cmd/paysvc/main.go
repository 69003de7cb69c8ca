// Command paysvc applies "payment succeeded" messages from RabbitMQ exactly
// once. Usage:
//
//	paysvc [--config FILE] migrate   apply the embedded schema migrations
//	paysvc [--config FILE] run       run the consumer daemon
//	paysvc version                   print the version
package main

import (
	"context"
	"fmt"
	"os"
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	if err := run(context.Background(), os.Args[1:], os.Environ(), os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "paysvc: %v\n", err)
		os.Exit(1)
	}
}
