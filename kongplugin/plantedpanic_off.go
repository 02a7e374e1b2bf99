//go:build !tollgate_testpanic

package kongplugin

// plantedPanic does nothing: only the tests' tollgate_testpanic build of a
// plugin server plants a panic (plantedpanic_on.go).
func plantedPanic(*instance) {}
