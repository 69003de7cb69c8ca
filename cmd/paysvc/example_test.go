package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/paysvc/paysvc/internal/listener"
)

// retry.delays is a YAML list of durations, or in the environment one
// comma-separated string; the last delay repeats for the retries past the
// list. Each delay is whole milliseconds, 100ms at least, and names its
// wait queue.
func Example_retryDelays() {
	dir, _ := os.MkdirTemp("", "paysvc-example")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "config.yaml")
	os.WriteFile(file, []byte("retry:\n  delays: [30s, 1m, 5m]\n"), 0o600)
	show := func(env map[string]string) {
		c, err := loadConfig(file, true, env)
		if err != nil {
			fmt.Println(err)
			return
		}
		var queues []string
		for _, d := range c.Retry.Delays {
			queues = append(queues, listener.WaitQueue(d))
		}
		fmt.Println(strings.Join(queues, " "))
	}
	show(nil)
	show(map[string]string{"PAYSVC_RETRY_DELAYS": "500ms, 1m30s,1h"})
	show(map[string]string{"PAYSVC_RETRY_DELAYS": "1s,,2s"})
	show(map[string]string{"PAYSVC_RETRY_DELAYS": "50ms,1s,1s"})
	// Output:
	// q.pay.dlx.wait.30s q.pay.dlx.wait.1m q.pay.dlx.wait.5m
	// q.pay.dlx.wait.500ms q.pay.dlx.wait.1m30s q.pay.dlx.wait.1h
	// invalid configuration:
	// retry.delays: want a duration such as 30s, 1m or 24h, got ""
	// retry.delays: want whole milliseconds of at least 100ms, got 0s
	// invalid configuration:
	// retry.delays: 1s appears twice (one wait queue per delay)
	// retry.delays: want whole milliseconds of at least 100ms, got 50ms
}
