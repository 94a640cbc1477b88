// Package httpx holds small net/http helpers the project's servers share.
package httpx

import "net/http"

// StatusRecorder is an http.ResponseWriter that remembers the status code
// of the answer: the first WriteHeader, or 200 at the first Write without
// one; 0 while nothing was written (an answer lost, hung or hijacked).
type StatusRecorder struct {
	http.ResponseWriter
	Status int
}

// WriteHeader records code (the first one only) and writes it.
func (r *StatusRecorder) WriteHeader(code int) {
	if r.Status == 0 {
		r.Status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

// Write records 200 when no status was written yet, and writes b.
func (r *StatusRecorder) Write(b []byte) (int, error) {
	if r.Status == 0 {
		r.Status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath (for
// Flush and Hijack).
func (r *StatusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
