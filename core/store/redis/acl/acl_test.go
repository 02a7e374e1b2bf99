package acl

import (
	"os"
	"strings"
	"testing"
)

// The README documents the user operators create: it must be this one.
func TestREADMEShowsTheRule(t *testing.T) {
	readme, err := os.ReadFile("../../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "ACL SETUSER tollgate " + Rule("<password>", "tollgate:")
	if !strings.Contains(string(readme), want) {
		t.Fatalf("README does not show the least-privilege user as\n%s", want)
	}
}
