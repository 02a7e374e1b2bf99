package redis

import (
	"context"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// batcher sends concurrent decisions to Redis in pipelines: each lane takes
// whatever calls are queued (up to max) and sends them in one round trip, so
// while one pipeline is in flight the next one fills. A busy gateway is then
// not capped at one decision per round trip per connection, and Redis reads
// and answers many scripts per system call.
type batcher struct {
	client  goredis.UniversalClient
	queue   chan *call
	max     int
	timeout time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
}

type call struct {
	keys  []string
	args  []any
	reply []int64
	err   error
	done  chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newBatcher(client goredis.UniversalClient, lanes, max int, timeout time.Duration) *batcher {
	b := &batcher{client: client, queue: make(chan *call, lanes*max), max: max, timeout: timeout, stop: make(chan struct{})}
	for i := 0; i < lanes; i++ {
		b.wg.Add(1)
		go b.lane()
	}
	return b
}

// do queues one script call and waits for its reply or ctx's end.
func (b *batcher) do(ctx context.Context, keys []string, args []any) ([]int64, error) {
	c := callPool.Get().(*call)
	c.keys, c.args, c.reply, c.err = keys, args, nil, nil
	select {
	case b.queue <- c:
	case <-ctx.Done():
		callPool.Put(c)
		return nil, ctx.Err()
	}
	select {
	case <-c.done:
		reply, err := c.reply, c.err
		callPool.Put(c)
		return reply, err
	case <-ctx.Done():
		// The lane still owns c and will signal it; leave it to the GC.
		return nil, ctx.Err()
	}
}

func (b *batcher) lane() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.max)
	for {
		select {
		case c := <-b.queue:
			batch = append(batch[:0], c)
		case <-b.stop:
			return
		}
	gather:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break gather
			}
		}
		b.send(batch)
	}
}

// send runs batch in one pipeline, loading the script once if Redis lost it.
func (b *batcher) send(batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	cmds := b.pipeline(ctx, batch)
	if noScript(cmds) {
		if err := decideScript.Load(ctx, b.client).Err(); err == nil {
			cmds = b.pipeline(ctx, batch)
		}
	}
	for i, c := range batch {
		c.reply, c.err = cmds[i].Int64Slice()
		c.done <- struct{}{}
	}
}

func (b *batcher) pipeline(ctx context.Context, batch []*call) []*goredis.Cmd {
	cmds := make([]*goredis.Cmd, len(batch))
	_, _ = b.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, c := range batch {
			cmds[i] = decideScript.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	return cmds
}

func noScript(cmds []*goredis.Cmd) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
}
