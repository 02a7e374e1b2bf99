//go:build tollgate_testpanic

package kongplugin

// plantedPanic panics in the access phase of an instance whose namespace
// is "planted-panic": a build with the tag tollgate_testpanic, which only
// the tests make, shows in real Kong what a bug's panic costs
// (internal/kongreal, TestKongPanicCostsOneEvent). Production builds
// have plantedpanic_off.go instead.
func plantedPanic(inst *instance) {
	if inst.Namespace == "planted-panic" {
		panic("planted panic (a tollgate_testpanic build)")
	}
}
