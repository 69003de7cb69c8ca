package idem

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// pipeline sends the claims and done marks that wait at one moment to Redis
// as one pipeline: one write and one read for all of them instead of one
// round trip each. Nothing waits for a pipeline to fill. Each command keeps
// its own reply and its own error.
type pipeline struct {
	rdb  redis.UniversalClient
	max  int
	reqs chan *call
	quit chan struct{}
	wg   sync.WaitGroup
	// waiting counts calls not answered yet (tests watch it).
	waiting atomic.Int32
}

type call struct {
	ctx  context.Context
	add  func(redis.Pipeliner) redis.Cmder
	cmd  redis.Cmder
	done chan struct{}
}

// StartPipeline makes the guard send concurrent claims and done marks
// through conns pipelines of up to max commands. Call it before the guard is
// used; stop waits for the pipelines to finish. After stop, calls go alone.
func (g *Guard) StartPipeline(conns, size int) (stop func()) {
	p := &pipeline{rdb: g.rdb, max: size, reqs: make(chan *call), quit: make(chan struct{})}
	for range max(conns, 1) {
		p.wg.Go(p.run)
	}
	g.pipe = p
	var once sync.Once
	return func() {
		once.Do(func() {
			close(p.quit)
			p.wg.Wait()
		})
	}
}

// do runs the command add puts on a pipeline, in a shared pipeline when
// there is one, and returns it with its reply or error.
func do[C redis.Cmder](ctx context.Context, g *Guard, add func(redis.Pipeliner) C) (C, error) {
	alone := func() (C, error) {
		pipe := g.rdb.Pipeline()
		cmd := add(pipe)
		pipe.Exec(ctx) // the error is cmd's own too
		return cmd, cmd.Err()
	}
	p := g.pipe
	if p == nil {
		return alone()
	}
	c := &call{ctx: ctx, add: func(pl redis.Pipeliner) redis.Cmder { return add(pl) }, done: make(chan struct{})}
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	select {
	case p.reqs <- c:
	case <-p.quit:
		return alone()
	case <-ctx.Done():
		var zero C
		return zero, ctx.Err()
	}
	<-c.done // the pipeline answers every call it took
	cmd := c.cmd.(C)
	return cmd, cmd.Err()
}

func (p *pipeline) run() {
	batch := make([]*call, 0, p.max)
	for {
		select {
		case <-p.quit:
			return
		case c := <-p.reqs:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < p.max {
			select {
			case c := <-p.reqs:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		p.exec(batch)
	}
}

// exec sends one pipeline, bounded by the earliest deadline among its calls.
func (p *pipeline) exec(batch []*call) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var cancel context.CancelFunc = func() {}
	for _, c := range batch {
		if d, ok := c.ctx.Deadline(); ok {
			if cur, has := ctx.Deadline(); !has || d.Before(cur) {
				cancel()
				ctx, cancel = context.WithDeadline(context.WithoutCancel(batch[0].ctx), d)
			}
		}
	}
	defer cancel()
	pipe := p.rdb.Pipeline()
	for _, c := range batch {
		c.cmd = c.add(pipe)
	}
	pipe.Exec(ctx)
	for _, c := range batch {
		close(c.done)
	}
}

// isNoScript reports Redis's answer to EVALSHA for a script it does not
// have (after a restart or SCRIPT FLUSH).
func isNoScript(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOSCRIPT")
}
