// Package reporoot finds the checkout a test or a benchmark command runs
// in, for the files it reads and the commands it builds from there.
package reporoot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
)

// Dir is the directory of tollgate's go.mod at or above the working
// directory.
func Dir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/tollgate/tollgate\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no tollgate go.mod at or above the working directory")
		}
		dir = parent
	}
}
