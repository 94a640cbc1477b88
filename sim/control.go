package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// AddFault adds rule to the company at companyBaseURL (e.g.
// http://127.0.0.1:8080/hotel) with POST <base>/_faults and returns an error
// unless it was accepted (201). It uses http.DefaultClient.
//
//	err := sim.AddFault(ctx, hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultSoldOut, Times: 1})
func AddFault(ctx context.Context, companyBaseURL string, r Rule) error {
	_, err := AddFaultRule(ctx, companyBaseURL, r)
	return err
}

// AddFaultRule is [AddFault] returning the rule as the company stored it,
// with its ID (for [RemoveFault]).
//
//	// Our test extension: 503 for about one hold in twenty.
//	rule, err := sim.AddFaultRule(ctx, hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultFail, Chance: 0.05})
func AddFaultRule(ctx context.Context, companyBaseURL string, r Rule) (Rule, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return Rule{}, fmt.Errorf("sim: add fault: %w", err)
	}
	var out Rule
	err = faultCall(ctx, http.MethodPost, companyBaseURL, "", body, http.StatusCreated, &out)
	return out, err
}

// RemoveFault removes one rule (by the ID [AddFaultRule] returned) of the
// company at companyBaseURL with DELETE <base>/_faults/{id}, and returns
// it as it was last, with how many requests it was applied to. The other
// rules stay.
func RemoveFault(ctx context.Context, companyBaseURL, id string) (Rule, error) {
	var out Rule
	err := faultCall(ctx, http.MethodDelete, companyBaseURL, "/"+url.PathEscape(id), nil, http.StatusOK, &out)
	return out, err
}

// ClearFaults removes every fault rule of the company at companyBaseURL
// with DELETE <base>/_faults.
func ClearFaults(ctx context.Context, companyBaseURL string) error {
	return faultCall(ctx, http.MethodDelete, companyBaseURL, "", nil, http.StatusOK, nil)
}

// ListFaults returns the fault rules of the company at companyBaseURL, with
// how many requests each was applied to.
func ListFaults(ctx context.Context, companyBaseURL string) ([]Rule, error) {
	var out struct {
		Items []Rule `json:"items"`
	}
	if err := faultCall(ctx, http.MethodGet, companyBaseURL, "", nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

func faultCall(ctx context.Context, method, base, sub string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+"/_faults"+sub, rd)
	if err != nil {
		return fmt.Errorf("sim: %s faults: %w", method, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("sim: %s faults: %w", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("sim: %s faults: read answer: %w", method, err)
	}
	if resp.StatusCode != want {
		return fmt.Errorf("sim: %s faults: %s: %s", method, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("sim: %s faults: decode answer: %w", method, err)
		}
	}
	return nil
}
