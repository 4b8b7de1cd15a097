// A CGI program written with Go's standard library (net/http/cgi), built with
// GOOS=wasip1 GOARCH=wasm: what a Go user deploys to Tern as a `cgi` tenant. The e2e tests
// build it and check what it reads of the request.
//
// Every request is answered with one line per fact: the protocol, method, path, host, the
// declared length and the bytes of body actually read.
package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"os"
)

func main() {
	err := cgi.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Toolchain", "go-net-http-cgi")
		fmt.Fprintf(w, "proto=%s\nmethod=%s\npath=%s\nhost=%s\ncontent-length=%d\nread=%d\n",
			r.Proto, r.Method, r.URL.Path, r.Host, r.ContentLength, len(body))
	}))
	if err != nil {
		// What net/http/cgi refuses (e.g. a SERVER_PROTOCOL it cannot parse) ends here.
		fmt.Fprintln(os.Stderr, "cgi:", err)
		os.Exit(1)
	}
}
