package adaptive

import (
	"sync"
	"sync/atomic"
	"time"
)

// A gateway that stalls (its process stopped, its machine too busy to run
// it, a long pause) holds the requests it has in flight past their
// answers: the latency it measures around the upstream then includes its
// own stall, and would read as the upstream slowing down. The stall watch
// tells the two apart by watching the process itself: a goroutine that
// wakes every stallTick and adds up how late it woke.

// stallTick is how often the stall watch wakes.
const stallTick = 10 * time.Millisecond

// stallNoise is how late a wake-up may be without counting: a loaded
// machine's scheduling delay, not a stall.
const stallNoise = 2 * stallTick

// MinStall is the least stall, summed over an interval, that keeps the
// interval from being judged (see Controller.NoteStall); an interval's
// threshold is the larger of MinStall and a tenth of the interval, the
// part of its answers a stall must hold back to move their latency
// quantile.
const MinStall = 50 * time.Millisecond

// stallWatch is the process's one stall watch, running while a
// controller that runs its own timer (New) is open.
var stallWatch struct {
	mu    sync.Mutex
	users int
	stop  chan struct{}
	// late sums, in ns, how late the watch woke beyond stallNoise, since
	// the process started.
	late atomic.Int64
}

// watchStalls starts the stall watch unless it runs; release stops it
// after its last user.
func watchStalls() (release func()) {
	w := &stallWatch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.users == 0 {
		w.stop = make(chan struct{})
		// The watch starts now, not when its goroutine first runs (late
		// on a busy machine): a stall right after this call is counted.
		go watch(w.stop, time.Now())
	}
	w.users++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.users--; w.users == 0 {
				close(w.stop)
			}
		})
	}
}

// watch wakes every stallTick until stop closes, adding how late it woke
// (since last, then since its previous wake) beyond stallNoise to
// stallWatch.late.
func watch(stop chan struct{}, last time.Time) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now() // monotonic: a wall clock step is no stall
		if late := now.Sub(last) - stallTick; late > stallNoise {
			stallWatch.late.Add(int64(late))
		}
		last = now
	}
}

// stalledSince returns the stall the watch saw since it read seen (ns),
// and what it reads now.
func stalledSince(seen int64) (time.Duration, int64) {
	now := stallWatch.late.Load()
	return time.Duration(now - seen), now
}
