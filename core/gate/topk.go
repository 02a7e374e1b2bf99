package gate

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
)

// DefaultTopDenied is how many keys a gate's rule tracks as its heaviest
// denied (Config.TopDenied).
const DefaultTopDenied = 10

// TopDeniedPeriod is the period over which the heaviest denied keys are
// counted: every period, each count is halved, so a key that stops being
// denied fades out within a few periods.
const TopDeniedPeriod = time.Minute

// Heavy is one of the keys a rule denied most: Count estimates its recent
// denials (with decay), never below the true count, at most Error above it.
type Heavy struct {
	Key          string
	Count, Error int64
}

// topK is the Space-Saving sketch (Metwally et al.) of the keys denied
// most: a fixed number of counters whatever the number of keys, so memory
// is O(counters). A new key takes over the smallest counter, inheriting
// its count as error; a key denied more than total/counters times is
// always held. The counters are a min-heap by count, so a denial costs
// O(log counters).
type topK struct {
	mu      sync.Mutex
	shown   int // how many top returns
	heap    []*heavyEntry
	index   map[string]*heavyEntry
	agedAt  time.Time
	nowFunc func() time.Time
}

type heavyEntry struct {
	Heavy
	at int // position in the heap
}

// counterFactor is how many counters the sketch keeps per key it shows: a
// shown key is then exact unless its denials are under 1/(100·shown) of
// the period's (100,000 keys: TestTopDeniedFindsHeavyHitters).
const counterFactor = 100

func newTopK(shown int) *topK {
	return &topK{shown: shown, index: make(map[string]*heavyEntry, shown*counterFactor), nowFunc: core.MonotonicTime}
}

// offer counts one denial of key.
func (t *topK) offer(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.age()
	if e, ok := t.index[key]; ok {
		e.Count++
		t.down(e.at)
		return
	}
	if len(t.heap) < t.shown*counterFactor {
		e := &heavyEntry{Heavy: Heavy{Key: key, Count: 1}, at: len(t.heap)}
		t.heap = append(t.heap, e)
		t.index[key] = e
		t.up(e.at)
		return
	}
	least := t.heap[0]
	delete(t.index, least.Key)
	least.Error, least.Key = least.Count, key
	least.Count++
	t.index[key] = least
	t.down(0)
}

// top returns the shown keys, most denied first.
func (t *topK) top() []Heavy {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.age()
	out := make([]Heavy, 0, len(t.heap))
	for _, e := range t.heap {
		out = append(out, e.Heavy)
	}
	slices.SortFunc(out, func(a, b Heavy) int {
		if a.Count != b.Count {
			return int(b.Count - a.Count)
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(len(out), t.shown)]
}

// up and down restore the heap order after entry i's count moved.
func (t *topK) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if t.heap[parent].Count <= t.heap[i].Count {
			return
		}
		t.swap(i, parent)
		i = parent
	}
}

func (t *topK) down(i int) {
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(t.heap) && t.heap[l].Count < t.heap[least].Count {
			least = l
		}
		if r < len(t.heap) && t.heap[r].Count < t.heap[least].Count {
			least = r
		}
		if least == i {
			return
		}
		t.swap(i, least)
		i = least
	}
}

func (t *topK) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.heap[i].at, t.heap[j].at = i, j
}

// age halves every count once per TopDeniedPeriod passed, dropping the
// keys that reach 0 (halving keeps the heap order, so only the dropped
// entries need rebuilding it). t.mu is held.
func (t *topK) age() {
	now := t.nowFunc()
	if t.agedAt.IsZero() || len(t.heap) == 0 {
		t.agedAt = now
		return
	}
	for now.Sub(t.agedAt) >= TopDeniedPeriod && len(t.heap) > 0 {
		t.agedAt = t.agedAt.Add(TopDeniedPeriod)
		kept := t.heap[:0]
		for _, e := range t.heap {
			e.Count /= 2
			e.Error /= 2
			if e.Count == 0 {
				delete(t.index, e.Key)
				continue
			}
			e.at = len(kept)
			kept = append(kept, e)
		}
		t.heap = kept
		for i := len(t.heap)/2 - 1; i >= 0; i-- {
			t.down(i)
		}
	}
}
