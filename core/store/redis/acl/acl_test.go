package acl

import (
	"os"
	"strings"
	"testing"
)

// The stores page documents the user operators create: it must be this one.
func TestDocsShowTheRule(t *testing.T) {
	readme, err := os.ReadFile("../../../../docs/stores.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "ACL SETUSER tollgate " + Rule("<password>", "tollgate:")
	if !strings.Contains(string(readme), want) {
		t.Fatalf("docs/stores.md does not show the least-privilege user as\n%s", want)
	}
}
