// Package refcount shares values by key among their users and closes each
// when its last user lets go: what survives a gateway's config reloads (a
// store, an adaptive controller) lives in one.
package refcount

import "sync"

// Pool holds values by key. The zero Pool is ready to use.
type Pool[T any] struct {
	mu      sync.Mutex
	entries map[string]*entry[T]
}

type entry[T any] struct {
	v    T
	refs int
}

// Acquire returns the value for key, calling open for it if no user holds
// one; each Acquire must be matched by one Release.
func (p *Pool[T]) Acquire(key string, open func() (T, error)) (T, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[key]; ok {
		e.refs++
		return e.v, nil
	}
	v, err := open()
	if err != nil {
		return v, err
	}
	if p.entries == nil {
		p.entries = map[string]*entry[T]{}
	}
	p.entries[key] = &entry[T]{v: v, refs: 1}
	return v, nil
}

// Release lets go of key's value; the last release calls close on it,
// outside the pool's lock.
func (p *Pool[T]) Release(key string, close func(T) error) error {
	p.mu.Lock()
	e, ok := p.entries[key]
	if !ok {
		p.mu.Unlock()
		return nil
	}
	e.refs--
	last := e.refs == 0
	if last {
		delete(p.entries, key)
	}
	p.mu.Unlock()
	if !last {
		return nil
	}
	return close(e.v)
}

// Len returns how many values are held.
func (p *Pool[T]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries)
}
