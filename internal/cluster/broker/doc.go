// Package broker starts the NATS server a cluster runs on (embedded, with
// JetStream in memory or on disk, a token or operator credentials, TLS
// when given a certificate) and connects clients to it with errors that
// say what to give (StartServer, Connect).
//
// Rules it keeps:
//
//  1. Nothing listens beyond the machine unless told so: an empty host is
//     loopback (StartServer). Test: TestServerAnyPort.
//  2. A server always asks for authentication: a token made up when none
//     is given (NewToken), or operator credentials. Tests:
//     TestCredentials, TestTLS (internal/cluster).
//  3. A refused connection names what was missing or wrong and how to
//     give it, never the secret itself (explain).
package broker
