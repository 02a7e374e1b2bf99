package memory

import (
	"testing"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return MustNew(Options{Clock: clock})
	})
}
