package idem

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/batch"
)

// pipeline sends the claims and done marks that wait at one moment to Redis
// as one pipeline: one write and one read for all of them instead of one
// round trip each. Nothing waits for a pipeline to fill. Each command keeps
// its own reply and its own error.
type pipeline struct {
	rdb   redis.UniversalClient
	calls *batch.Collector[*call]
}

type call struct {
	ctx  context.Context
	add  func(redis.Pipeliner) redis.Cmder
	cmd  redis.Cmder
	done chan struct{}
}

// StartPipeline makes the guard send concurrent claims and done marks
// through conns pipelines of up to size commands. Call it before the guard
// is used; stop waits for the pipelines to finish. After stop, calls go
// alone.
func (g *Guard) StartPipeline(conns, size int) (stop func()) {
	p := &pipeline{rdb: g.rdb}
	p.calls = batch.Start(max(conns, 1), size, p.exec)
	g.pipe = p
	return p.calls.Stop
}

// do runs the command add puts on a pipeline, in a shared pipeline when
// there is one, and returns it with its reply or error.
func do[C redis.Cmder](ctx context.Context, g *Guard, add func(redis.Pipeliner) C) (C, error) {
	c := &call{ctx: ctx, add: func(pl redis.Pipeliner) redis.Cmder { return add(pl) }, done: make(chan struct{})}
	var calls *batch.Collector[*call]
	if g.pipe != nil {
		calls = g.pipe.calls
	}
	taken, err := calls.Send(ctx, c)
	switch {
	case err != nil:
		var zero C
		return zero, err
	case !taken:
		pipe := g.rdb.Pipeline()
		cmd := add(pipe)
		pipe.Exec(ctx) // the error is cmd's own too
		return cmd, cmd.Err()
	}
	<-c.done // the pipeline answers every call it took
	cmd := c.cmd.(C)
	return cmd, cmd.Err()
}

// exec sends one pipeline, bounded by the earliest deadline among its calls.
func (p *pipeline) exec(calls []*call) {
	ctx, cancel := batch.Context(calls, func(c *call) context.Context { return c.ctx })
	defer cancel()
	pipe := p.rdb.Pipeline()
	for _, c := range calls {
		c.cmd = c.add(pipe)
	}
	pipe.Exec(ctx)
	for _, c := range calls {
		close(c.done)
	}
}

// isNoScript reports Redis's answer to EVALSHA for a script it does not
// have (after a restart or SCRIPT FLUSH).
func isNoScript(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOSCRIPT")
}
