package listener_test

import (
	"fmt"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
)

// Each delay of retry.delays has its wait queue, named by the delay
// written the short way: whole seconds, minutes and hours as Go writes
// them without the trailing zero units, anything finer in milliseconds.
func ExampleWaitQueue() {
	for _, d := range []time.Duration{30 * time.Second, time.Minute, 90 * time.Second, time.Hour, 150 * time.Minute, 1500 * time.Millisecond} {
		fmt.Println(listener.FormatDelay(d), listener.WaitQueue(d))
	}
	// Output:
	// 30s q.pay.dlx.wait.30s
	// 1m q.pay.dlx.wait.1m
	// 1m30s q.pay.dlx.wait.1m30s
	// 1h q.pay.dlx.wait.1h
	// 2h30m q.pay.dlx.wait.2h30m
	// 1500ms q.pay.dlx.wait.1500ms
}
