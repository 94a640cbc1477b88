package main

import (
	"testing"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestMain stops the private PostgreSQL cluster the tests of this package
// may start (testenv).
func TestMain(m *testing.M) { testenv.Main(m) }
