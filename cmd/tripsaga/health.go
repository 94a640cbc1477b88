package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func healthCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health URL",
		Short: "Exit 0 if URL answers 2xx (a health check for images without curl); a URL without a path means its /readyz",
		Long: `health sends GET URL and exits 0 when the answer is 2xx, non-zero otherwise
(an error, a timeout, any other status), printing why. A URL without a path
(http://127.0.0.1:8080) checks its /readyz, the readiness every tripsaga
process serves; name /healthz to check liveness only. It exists for
container health checks: the distroless image has no curl.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return checkHealth(cmd.Context(), cmd.OutOrStdout(), args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return cmd
}

// checkHealth GETs target (its /readyz when it has no path) within timeout
// and returns nil for a 2xx answer, else an error naming the status or the
// failure.
func checkHealth(ctx context.Context, w io.Writer, target string, timeout time.Duration) error {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("health: %q: want an http:// or https:// URL with a host", target)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("health: %s answered %s: %s", u, resp.Status, msg)
	}
	fmt.Fprintf(w, "%s: %s %s\n", u, resp.Status, msg)
	return nil
}
