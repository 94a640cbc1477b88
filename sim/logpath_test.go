package sim

import "testing"

// The simulators' request log never shows a card token in full.
func TestLogPathMasksCardTokens(t *testing.T) {
	for in, want := range map[string]string{
		"/payments/statements/tok_visa_4242424242": "/payments/statements/***4242",
		"/payments/statements/tok_visa":            "/payments/statements/***",
		"/hotel/holds/T-1:hotel":                   "/hotel/holds/T-1:hotel",
	} {
		if got := logPath(in); got != want {
			t.Errorf("logPath(%q) = %q, want %q", in, got, want)
		}
	}
}
