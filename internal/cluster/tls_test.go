package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dflow test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return cert, key
}

// TestTLS: with a certificate the embedded server speaks TLS only; a
// client that trusts its CA joins, one without the token is refused.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, key := selfSigned(t)
	srv, err := StartServer(ServerOptions{TLSCert: cert, TLSKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if !strings.HasPrefix(srv.URL, "tls://127.0.0.1:") {
		t.Fatalf("URL %s", srv.URL)
	}
	nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token, CA: cert})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := Connect(ConnOptions{URL: srv.URL, CA: cert}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("without a token: %v", err)
	}
	plain := "nats://" + strings.TrimPrefix(srv.URL, "tls://")
	if nc, err := Connect(ConnOptions{URL: plain, Token: srv.Token}); err == nil {
		nc.Close()
		t.Error("a plain connection to a TLS server was accepted")
	}
}
