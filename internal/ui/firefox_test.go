package ui

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// marionette is a minimal client of Firefox's Marionette protocol (its
// remote control: length-prefixed JSON commands over TCP), enough to load
// a page and evaluate scripts in it; chromedp speaks only Chromium's.
type marionette struct {
	conn net.Conn
	r    *bufio.Reader
	id   int
}

func (m *marionette) read() ([]any, error) {
	n, err := m.r.ReadString(':')
	if err != nil {
		return nil, err
	}
	size, err := strconv.Atoi(strings.TrimSuffix(n, ":"))
	if err != nil {
		return nil, fmt.Errorf("marionette: frame size %q", n)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(m.r, buf); err != nil {
		return nil, err
	}
	var msg []any
	if err := json.Unmarshal(buf, &msg); err != nil {
		// The first frame is a greeting object, not a command reply.
		return nil, nil
	}
	return msg, nil
}

// call sends one command and returns its result.
func (m *marionette) call(name string, params map[string]any) (any, error) {
	m.id++
	b, _ := json.Marshal([]any{0, m.id, name, params})
	if _, err := fmt.Fprintf(m.conn, "%d:%s", len(b), b); err != nil {
		return nil, err
	}
	msg, err := m.read()
	if err != nil {
		return nil, err
	}
	if len(msg) != 4 {
		return nil, fmt.Errorf("marionette: %s: reply %v", name, msg)
	}
	if msg[2] != nil {
		return nil, fmt.Errorf("marionette: %s: %v", name, msg[2])
	}
	return msg[3], nil
}

// eval runs script (a function body) in the page and returns its value.
func (m *marionette) eval(script string) (any, error) {
	v, err := m.call("WebDriver:ExecuteScript", map[string]any{"script": script, "args": []any{}})
	if err != nil {
		return nil, err
	}
	if r, ok := v.(map[string]any); ok {
		return r["value"], nil
	}
	return v, nil
}

// firefox starts headless Firefox with Marionette on a free port and
// connects to it; it skips the test where no Firefox is installed.
func firefox(t *testing.T) *marionette {
	exe := ""
	for _, name := range []string{"firefox-esr", "firefox"} {
		if p, err := exec.LookPath(name); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		t.Skip("no firefox-esr or firefox on PATH: the page is not tested in Firefox here (apt-get install firefox-esr)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	profile := t.TempDir()
	os.WriteFile(profile+"/user.js", []byte(fmt.Sprintf("user_pref(\"marionette.port\", %d);\n", port)), 0o644)
	cmd := exec.Command(exe, "--headless", "--marionette", "--no-remote", "--profile", profile)
	cmd.Env = append(os.Environ(), "HOME="+profile, "MOZ_HEADLESS=1")
	if err := cmd.Start(); err != nil {
		t.Skipf("firefox does not start: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var conn net.Conn
	if !testutil.Within(60*time.Second, func() bool {
		conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err == nil
	}) {
		t.Fatalf("firefox's marionette never listened on port %d", port)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	m := &marionette{conn: conn, r: bufio.NewReader(conn)}
	if _, err := m.read(); err != nil { // the greeting
		t.Fatal(err)
	}
	if _, err := m.call("WebDriver:NewSession", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPageInFirefox: the live page works in Firefox too: every stage and
// replica is drawn, and the hs edge's figures change as the run proceeds.
func TestPageInFirefox(t *testing.T) {
	m := firefox(t)
	// A long run, drained once the page has shown what it should.
	g := loadSpec(t, "../../specs/seed.hcl", "stage.reader.config.count=1000000",
		"stage.target.config.service_time=5ms", "stage.drafter.config.service_time=2500us")
	drain := make(chan struct{})
	url, wait, shutdown := livePipeline(t, g, "seed", drain)
	defer shutdown()
	defer wait()
	var once sync.Once
	stop := func() { once.Do(func() { close(drain) }) }
	defer stop()
	if _, err := m.call("WebDriver:Navigate", map[string]any{"url": url}); err != nil {
		t.Fatal(err)
	}
	var replicas int
	for _, s := range g.Stages {
		replicas += s.Replicas
	}
	seen := map[string]bool{}
	var got []any
	if !testutil.Within(60*time.Second, func() bool {
		v, err := m.eval(`const e = document.querySelector('[data-edge="hs"]');
			const qs = [...document.querySelectorAll('[data-queue^="hs/"]')].map(q => q.textContent);
			return [document.querySelectorAll("[data-stage]").length, document.querySelectorAll("[data-replica]").length,
				e ? e.textContent + " | " + qs.join(" ") : ""];`)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = v.([]any)
		if len(got) == 3 && got[0] == float64(len(g.Stages)) && got[1] == float64(replicas) && got[2] != "" {
			seen[got[2].(string)] = true
		}
		return len(seen) >= 2
	}) {
		t.Fatalf("Firefox never showed every stage and replica with changing hs figures: last %v, seen %v", got, seen)
	}
	t.Logf("hs showed %v in Firefox", seen)
}
