package outbox

import (
	"context"

	"github.com/paysvc/paysvc/internal/broker"
)

// DispatchOnce is one poll of Run: dispatchDue, with the work after the
// lease detached from ctx as Run's is.
func (d *Dispatcher) DispatchOnce(ctx context.Context, pub *broker.Publisher) (int, error) {
	return d.dispatchDue(ctx, context.WithoutCancel(ctx), pub)
}

// Marks is how many UPDATE statements marked notices sent.
func (d *Dispatcher) Marks() int { return d.marks }

// Batches is how many publish batches took handed-over notices.
func (d *Dispatcher) Batches() int { return int(d.batches.Load()) }
