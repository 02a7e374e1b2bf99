package core

// Version is tollgate's release: what every adapter reports as its
// version and the operators' API answers (GET version). Each release's
// changes: CHANGELOG.md.
const Version = "0.2.0"
