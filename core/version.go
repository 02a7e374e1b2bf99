package core

// Version is tollgate's release: what the Kong plugin servers report to
// Kong (-dump) and print (`tollgate version`), and what the operators' API
// answers (GET version). Each release's changes: CHANGELOG.md.
const Version = "0.2.0"
