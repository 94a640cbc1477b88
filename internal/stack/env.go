package stack

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/natsauth"
)

// EnvFile is the file in a stack's folder that a running stack writes
// every URL to, as shell lines ("export NAME='value'"; `. D/up.env` sets
// them), and removes when it stops. [ReadEnvFile] reads it.
const EnvFile = "up.env"

// Env returns what a process needs to reach the running stack: NATS_URL
// (comma-separated client URLs in a NATS cluster), DATABASE_URL, the
// companies (HOTEL_URL, PAYMENTS_URL, CARS_URL, MAIL_URL), TRIPS_URL and
// RECONCILER_URL (the first replicas), TRIPS_URLS (every trips replica,
// comma-separated), STREAM_REPLICAS (what the services create the
// streams with, so a tool using this stack asks for the same), and
// NATS_NKEY: the seed file of the operator identity, natsauth.Admin, which
// the tools and the nats CLI connect as (not NATS_CREDS, which the nats CLI
// takes for a JWT creds file; the tools read NATS_NKEY when NATS_CREDS is
// unset); and OPERATOR_TOKEN when the reconciler has one
// ([Stack.OperatorToken]).
func (s *Stack) Env() map[string]string {
	env := s.CompanyURLs()
	env["NATS_URL"] = s.NATSURL
	env["DATABASE_URL"] = s.DatabaseURL
	env["TRIPS_URL"] = s.URL("trips")
	env["TRIPS_URLS"] = strings.Join(s.URLs("trips"), ",")
	env["RECONCILER_URL"] = s.URL("reconciler")
	env["STREAM_REPLICAS"] = strconv.Itoa(s.StreamReplicas())
	env[natsauth.EnvNkey] = s.Creds(natsauth.Admin)
	if tok := s.OperatorToken(); tok != "" {
		env[operatorTokenEnv] = tok
	}
	return env
}

// operatorTokenEnv is reconciler.OperatorTokenEnv (the stack does not
// import the reconciler).
const operatorTokenEnv = "OPERATOR_TOKEN"

// OperatorToken is the operators' bearer token the stack's reconciler was
// given (the last OPERATOR_TOKEN of Config.Env, else of the stack's own
// environment), or "" when it has none and refuses every action.
// [Stack.Env] carries it, so up.env (mode 0600) lets the tools act.
func (s *Stack) OperatorToken() string {
	for i := len(s.cfg.Env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(s.cfg.Env[i], operatorTokenEnv+"="); ok {
			return v
		}
	}
	return os.Getenv(operatorTokenEnv)
}

// EnvNames returns the names of [Stack.Env] in the order they are printed
// and written: NATS_URL, DATABASE_URL, then the rest by name.
func EnvNames(env map[string]string) []string {
	var rest []string
	for k := range env {
		if k != "NATS_URL" && k != "DATABASE_URL" {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append([]string{"NATS_URL", "DATABASE_URL"}, rest...)
}

// ExportLine renders one variable as a POSIX shell line:
// export NAME='value'.
func ExportLine(name, value string) string {
	return "export " + name + "='" + strings.ReplaceAll(value, "'", `'\''`) + "'"
}

func (s *Stack) writeEnvFile() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# The running tripsaga stack in this folder (pid %d, since %s).\n# Source it (. %s) to use it; it is removed when the stack stops.\n",
		os.Getpid(), time.Now().UTC().Format(time.RFC3339), filepath.Join(s.cfg.Dir, EnvFile))
	env := s.Env()
	for _, k := range EnvNames(env) {
		b.WriteString(ExportLine(k, env[k]) + "\n")
	}
	tmp := filepath.Join(s.cfg.Dir, EnvFile+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil { // it holds the administrator's password
		return fmt.Errorf("stack: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.cfg.Dir, EnvFile)); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return nil
}

// ReadEnvFile reads the [EnvFile] in dir into a map of NAME to value. It
// does not check that the stack still runs (see [Running]). Errors: the
// file cannot be read (wraps os.ErrNotExist when absent), or a line is not
// a comment, blank, or export NAME='value'.
func ReadEnvFile(dir string) (map[string]string, error) {
	path := filepath.Join(dir, EnvFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("stack: %s:%d: want export NAME='value'", path, n)
		}
		v, err := unquote(value)
		if err != nil {
			return nil, fmt.Errorf("stack: %s:%d: %w", path, n, err)
		}
		env[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("stack: %s: %w", path, err)
	}
	return env, nil
}

// unquote undoes [ExportLine]'s single quoting (a quote inside the value
// is written as quote, backslash, quote, quote); an unquoted value is taken
// as it is.
func unquote(v string) (string, error) {
	if !strings.HasPrefix(v, "'") {
		return v, nil
	}
	var b strings.Builder
	for rest := v; rest != ""; {
		switch {
		case strings.HasPrefix(rest, `\'`):
			b.WriteByte('\'')
			rest = rest[2:]
		case rest[0] == '\'':
			end := strings.IndexByte(rest[1:], '\'')
			if end < 0 {
				return "", errors.New("unterminated quote in " + strconv.Quote(v))
			}
			b.WriteString(rest[1 : 1+end])
			rest = rest[end+2:]
		default:
			return "", errors.New("unexpected text after a quote in " + strconv.Quote(v))
		}
	}
	return b.String(), nil
}
