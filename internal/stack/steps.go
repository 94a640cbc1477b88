package stack

import (
	"os"
	"slices"
	"strings"

	"github.com/tripsaga/tripsaga/events"
)

// steps returns the STEPS value the children of cfg run with: the last
// STEPS= of cfg.Env, else this process's own.
func steps(cfg Config) string {
	v := os.Getenv(events.StepsVar)
	for _, kv := range cfg.Env {
		if s, ok := strings.CutPrefix(kv, events.StepsVar+"="); ok {
			v = s
		}
	}
	return v
}

// optionalServices returns the services the catalogue of cfg's STEPS adds
// to [Services] ("insurance" when STEPS names it), in saga order; none
// when STEPS is invalid (Start refuses it).
func optionalServices(cfg Config) []string {
	cat, err := events.ParseSteps(steps(cfg))
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range cat.Services() {
		if !slices.Contains(Services, s) {
			out = append(out, s)
		}
	}
	return out
}

// optionalCompanies are the companies of the optional steps' services:
// the variable that names each and its path under the simulators.
var optionalCompanies = map[string]struct{ variable, path string }{ //nolint:gochecknoglobals // read-only table
	"insurance": {"INSURER_URL", "/insurer"},
}

// processesOf returns [Processes] and then the optional services of cfg:
// each one's first replica comes after the fixed ones, so the fixed ports
// of a BasePort layout do not move when a step is turned on.
func processesOf(cfg Config) []string {
	return append(slices.Clone(Processes), optionalServices(cfg)...)
}

// servicesOf returns [Services] and then the optional services of cfg.
func servicesOf(cfg Config) []string {
	return append(slices.Clone(Services), optionalServices(cfg)...)
}
