package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ServiceURLsEnv names the environment variable that gives the reconciler
// process the base URLs of the services' operator endpoints (GET
// /steps/{trip_id}, GET /incidents, and the trips service's GET /ops/trips),
// as name=url pairs separated by commas:
// "trips=http://127.0.0.1:7405,hotel=http://127.0.0.1:7402". `tripsaga up`
// sets it. Without it timelines have no step rows and no incidents, and
// say so.
const ServiceURLsEnv = "SERVICE_URLS"

// ParseServiceURLs reads the value of [ServiceURLsEnv]. An empty value is
// no services. An error names the pair that is not name=http(s)://host.
func ParseServiceURLs(s string) (map[string]string, error) {
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, raw, ok := strings.Cut(pair, "=")
		u, err := url.Parse(raw)
		if !ok || name == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: %s: %q is not name=http://host:port", ErrInvalidConfig, ServiceURLsEnv, pair)
		}
		out[name] = strings.TrimRight(raw, "/")
	}
	return out, nil
}

// notFoundError is a 404 answer.
type notFoundError struct{ url string }

func (e *notFoundError) Error() string { return "GET " + e.url + ": 404" }

// opsHTTP is the client of the services' and companies' read endpoints.
var opsHTTP = &http.Client{Timeout: 5 * time.Second} //nolint:gochecknoglobals // shared connection pool

// httpGet GETs u; a status other than 200 is an error ([*notFoundError]
// for 404). The caller closes the body.
func httpGet(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil) //nolint:gosec // u is a configured service URL, the operator's
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json, text/plain")
	resp, err := opsHTTP.Do(req) //nolint:gosec // u is a configured service URL, the operator's
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, &notFoundError{u}
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return nil, fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, strings.TrimSpace(string(b)))
}

// getJSON GETs u into v (see [httpGet]).
func getJSON(ctx context.Context, u string, v any) error {
	resp, err := httpGet(ctx, u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 32<<20)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}
