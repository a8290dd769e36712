//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
)

// proc is one kvstore node running as a child process of the demo, so that
// a pause is a real SIGSTOP and a crash a real SIGKILL.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	err    error         // Wait's result, valid after exited

	gossip, grpcAddr, status string
	conn                     *grpc.ClientConn
	kv                       kvpb.KVClient

	last kvnode.Stats // the node's counters (/kv/stats) at the last scrape
}

// spawn starts cmd, the demo's own executable as the kvstore node name
// (see main), and waits for its ready line. Its log goes to logPath.
func spawn(ctx context.Context, cmd *exec.Cmd, name, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	cmd.SysProcAttr = childAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out) // nothing else is printed; drain anyway
		// Wait only after stdout's EOF, as os/exec requires of pipe readers.
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()

	var line string
	select {
	case line = <-lines:
	case <-time.After(20 * time.Second):
	case <-ctx.Done():
	}
	var r kvnode.Ready
	if line == "" || json.Unmarshal([]byte(line), &r) != nil || r.Event != "ready" {
		p.kill()
		return nil, fmt.Errorf("node %s did not start (log: %s)", name, logPath)
	}
	p.gossip, p.grpcAddr, p.status = r.Gossip, r.GRPC, r.Status
	p.conn, err = grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.kill()
		return nil, err
	}
	p.kv = kvpb.NewKVClient(p.conn)
	return p, nil
}

func (p *proc) signal(s syscall.Signal) error { return p.cmd.Process.Signal(s) }

// kill ends the process at once (a crash) and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies too, but be plain
	_ = p.cmd.Process.Kill()
	<-p.exited
	if p.conn != nil {
		p.conn.Close()
	}
}

// stop asks the node to leave gracefully (SIGTERM: hand its partitions
// over, then exit) and waits for it.
func (p *proc) stop(ctx context.Context) error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	}
	p.conn.Close()
	if p.err != nil {
		return fmt.Errorf("node %s: %w", p.name, p.err)
	}
	return nil
}

var httpClient = &http.Client{Timeout: time.Second}

// getJSON fetches a node's page into v.
func (p *proc) getJSON(path string, v any) error {
	resp, err := httpClient.Get("http://" + p.status + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %s", p.status, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// scrape refreshes p.last from the node's counters; a node that does not
// answer (paused, gone) keeps its last figures.
func (p *proc) scrape() {
	var s kvnode.Stats
	if p.getJSON("/kv/stats", &s) == nil {
		p.last = s
	}
}

// cut makes the node drop all gossip to and from the given gossip
// addresses; no addresses heals it.
func (p *proc) cut(peers []string) error {
	return p.post("/debug/cut?peers=" + url.QueryEscape(strings.Join(peers, ",")))
}

// post sends a fault-control request to the node's status server.
func (p *proc) post(path string) error {
	resp, err := httpClient.Post("http://"+p.status+path, "text/plain", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s on %s: %s", path, p.name, resp.Status)
	}
	return nil
}

// holding reports whether a write waits at the node's hold on partition.
func (p *proc) holding(partition uint32) bool {
	var v struct {
		Waiting bool `json:"waiting"`
	}
	return p.getJSON(fmt.Sprintf("/debug/hold?partition=%d", partition), &v) == nil && v.Waiting
}

// view is the part of a node's status page the demo reads.
type view struct {
	Converged bool `json:"converged"`
	Members   []struct {
		Name string
	} `json:"members"`
	Partitions []struct {
		Holder string `json:"holder"`
	} `json:"partitions"`
}

// held returns how many partitions the node sees held by name (-1 if it
// does not answer).
func (p *proc) held(name string) int {
	var v view
	if p.getJSON("/?format=json", &v) != nil {
		return -1
	}
	n := 0
	for _, part := range v.Partitions {
		if part.Holder == name {
			n++
		}
	}
	return n
}

// settled reports whether the node sees exactly the given members and
// holds its share of a converged cluster.
func (p *proc) settled(members map[string]bool) bool {
	var v view
	if p.getJSON("/?format=json", &v) != nil || !v.Converged || len(v.Members) != len(members) {
		return false
	}
	for _, m := range v.Members {
		if !members[m.Name] {
			return false
		}
	}
	return true
}
