package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// operatorServer starts a NATS server in operator mode (accounts and users
// by signed JWTs, as managed NATS deployments run) with JetStream for one
// account, and writes a credentials file for a user of it.
func operatorServer(t *testing.T) (url, creds string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	must(err)
	oc, err = jwt.DecodeOperatorClaims(ojwt)
	must(err)

	newAccount := func(js bool) (nkeys.KeyPair, string, string) {
		akp, err := nkeys.CreateAccount()
		must(err)
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		must(err)
		return akp, apub, ajwt
	}
	akp, apub, ajwt := newAccount(true)
	_, spub, sjwt := newAccount(false) // the system account
	res := &server.MemAccResolver{}
	must(res.Store(apub, ajwt))
	must(res.Store(spub, sjwt))

	ukp, err := nkeys.CreateUser()
	must(err)
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	ujwt, err := uc.Encode(akp)
	must(err)
	seed, _ := ukp.Seed()
	b, err := jwt.FormatUserConfig(ujwt, seed)
	must(err)
	creds = filepath.Join(t.TempDir(), "dflow.creds")
	must(os.WriteFile(creds, b, 0o600))

	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: res, SystemAccount: spub, NoLog: true, NoSigs: true})
	must(err)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the operator-mode server did not start")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL(), creds
}

// TestCredentials: a server of one's own that takes NATS credentials
// files: a worker and a coordinator with the file run the seed; one
// without it, or with a file that is not there, is refused in words.
func TestCredentials(t *testing.T) {
	t.Parallel()
	url, creds := operatorServer(t)
	tc := &testCluster{srv: &Server{URL: url}, reg: nodes.Default}
	tc.creds = creds
	tc.startWorkers(t, 2)
	rep, _, err := tc.run(t, "../../specs/seed.hcl", 2, "stage.target.config.service_time=1ms", "stage.drafter.config.service_time=1ms")
	if err != nil {
		t.Fatal(err)
	}
	if e := rep.Edges["trained"]; e.Produced != 300 || e.Consumed != 300 {
		t.Errorf("trained: produced %d, consumed %d, want 300", e.Produced, e.Consumed)
	}
	if _, err := Connect(ConnOptions{URL: url}); err == nil || !strings.Contains(err.Error(), "refused the connection") || !strings.Contains(err.Error(), "--creds") {
		t.Errorf("without credentials: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "nope.creds")
	if _, err := Connect(ConnOptions{URL: url, Creds: missing}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("with a missing file: %v", err)
	}
	if _, err := Connect(ConnOptions{URL: url, Creds: creds, Token: "x"}); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("with a token and a file: %v", err)
	}
}
