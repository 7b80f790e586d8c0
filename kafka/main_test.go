package kafka

import (
	"os"
	"testing"
)

// TestMain runs the child processes some tests start (re-executing the test binary
// with an environment variable set) instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(groupChildEnv) == "1" {
		os.Exit(groupChildMain())
	}
	os.Exit(m.Run())
}
