package trips

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"
)

// PolicyFileVar names the environment variable holding the path of a
// cancellation fee policy file (the shape of cancellation_policy.json);
// unset: the policy shipped in that file.
const PolicyFileVar = "CANCELLATION_POLICY_FILE"

//go:embed cancellation_policy.json
var defaultPolicy []byte

// ErrInvalidPolicy is wrapped by every error of [ParsePolicy].
var ErrInvalidPolicy = errors.New("trips: invalid cancellation policy")

// FeeBand is one band of a [Policy]: when less than WithinHours are left
// before check-in, the fee is PercentOfOneNight % of one night.
type FeeBand struct {
	Name              string `json:"name"`
	WithinHours       int    `json:"within_hours"`
	PercentOfOneNight int    `json:"percent_of_one_night"`
}

// Policy is the traveler's cancellation fee policy: data
// (cancellation_policy.json, or the file [PolicyFileVar] names), not code.
// One night is the amount charged divided by the nights; the check-in is
// 00:00 UTC of the check-in date.
type Policy struct {
	About    string    `json:"about,omitempty"`
	FreeBand string    `json:"free_band"`
	Bands    []FeeBand `json:"bands"`
}

// DefaultPolicy returns the policy shipped in cancellation_policy.json:
// free until 7 days before check-in, 50 % of one night inside 7 days,
// 100 % of one night inside 48 hours.
func DefaultPolicy() Policy {
	p, err := ParsePolicy(defaultPolicy)
	if err != nil {
		panic(err) // the embedded file is checked by its test
	}
	return p
}

// LoadPolicy returns the policy of the file $CANCELLATION_POLICY_FILE, or
// [DefaultPolicy] when it is unset. The error names the file and the
// field.
func LoadPolicy() (Policy, error) {
	path := os.Getenv(PolicyFileVar)
	if path == "" {
		return DefaultPolicy(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %s=%s: %w", ErrInvalidPolicy, PolicyFileVar, path, err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return Policy{}, fmt.Errorf("%s=%s: %w", PolicyFileVar, path, err)
	}
	return p, nil
}

// ParsePolicy decodes and checks a policy: JSON of [Policy]'s shape, no
// unknown member, free_band named, every band named with within_hours
// from 1 to 8760 (each once) and percent_of_one_night from 0 to 100. Its
// errors wrap [ErrInvalidPolicy] and name the field.
func ParsePolicy(b []byte) (Policy, error) {
	var p Policy
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	var errs []error
	if strings.TrimSpace(p.FreeBand) == "" {
		errs = append(errs, fmt.Errorf("%w: free_band: required", ErrInvalidPolicy))
	}
	seen := map[int]bool{}
	for i, b := range p.Bands {
		at := fmt.Sprintf("bands[%d]", i)
		if strings.TrimSpace(b.Name) == "" {
			errs = append(errs, fmt.Errorf("%w: %s.name: required", ErrInvalidPolicy, at))
		}
		if b.WithinHours < 1 || b.WithinHours > 8760 {
			errs = append(errs, fmt.Errorf("%w: %s.within_hours: want 1 to 8760, got %d", ErrInvalidPolicy, at, b.WithinHours))
		}
		if seen[b.WithinHours] {
			errs = append(errs, fmt.Errorf("%w: %s.within_hours: %d is another band's too", ErrInvalidPolicy, at, b.WithinHours))
		}
		seen[b.WithinHours] = true
		if b.PercentOfOneNight < 0 || b.PercentOfOneNight > 100 {
			errs = append(errs, fmt.Errorf("%w: %s.percent_of_one_night: want 0 to 100, got %d", ErrInvalidPolicy, at, b.PercentOfOneNight))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Policy{}, err
	}
	// Fewest hours first: the first band that applies wins.
	slices.SortFunc(p.Bands, func(a, b FeeBand) int { return a.WithinHours - b.WithinHours })
	return p, nil
}

// Fee is what the policy keeps of a cancellation and what it refunds, in
// minor units: FeeCents + RefundCents == the charge, neither negative.
type Fee struct {
	Band        string
	FeeCents    int64
	RefundCents int64
}

// Fee returns the fee of canceling, at now, a stay of nights from checkIn
// (a date; the check-in is its 00:00 UTC) for which charged minor units
// were charged. One night is charged / nights; the fee is percent of it,
// rounded down (exact for any charged: no overflow), and never more than
// charged. nights below 1 count as 1; a negative charge as 0.
func (p Policy) Fee(charged int64, nights int, checkIn, now time.Time) Fee {
	if nights < 1 {
		nights = 1
	}
	charged = max(charged, 0)
	left := time.Date(checkIn.Year(), checkIn.Month(), checkIn.Day(), 0, 0, 0, 0, time.UTC).Sub(now)
	for _, b := range p.Bands {
		if left < time.Duration(b.WithinHours)*time.Hour {
			// charged × percent / (100 × nights), in big integers.
			fee := new(big.Int).Mul(big.NewInt(charged), big.NewInt(int64(b.PercentOfOneNight)))
			fee.Quo(fee, big.NewInt(100*int64(nights)))
			f := min(fee.Int64(), charged)
			return Fee{Band: b.Name, FeeCents: f, RefundCents: charged - f}
		}
	}
	return Fee{Band: p.FreeBand, FeeCents: 0, RefundCents: charged}
}
