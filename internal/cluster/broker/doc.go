// Package broker starts the NATS server a cluster runs on (embedded, with
// JetStream in memory or on disk, a token or operator credentials, TLS
// when given a certificate) and connects clients to it with errors that
// say what to give (StartServer, Connect). It also speaks JetStream's
// pull protocol for a client that asks a durable consumer for messages on
// a subscription of its own, as a queue's consumer side does (package
// edge): the request (NextSubject, PullRequest), the status messages
// (PullStatus) and the messages that came (Pulled).
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
//  4. A request that expired or was cut short says how many of its
//     messages will not come; a heartbeat says nothing; a deleted
//     consumer, or an end that does not say how much, is an error.
//     PullStatus; TestPullStatus.
//  5. A message pulled reads its delivery count and sequences from its
//     reply subject, in both of the server's forms, and acks there.
//     NewPulled, ackMetadata; TestPulledMetadata.
package broker
