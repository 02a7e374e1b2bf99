// Package store holds the stores, one in each subfolder, each a sibling
// of the others and none importing another: memory (in process), redis
// (exact, with its deny cache), eventual (local decisions, counts synced
// through Redis) and failover (the failure policy around a shared store,
// falling back to a memory store), with storetest, the conformance suite.
// This package's tests run that suite on every store and composition.
// core/openstore opens and composes them; the contract they implement is
// core.Store.
package store
