// Command dflow-plugin-checksum is dflow's example plugin. It offers one
// node kind, crc (checksum/crc in a spec): every item passes through
// unchanged, and a CRC-32 of each item's payload is counted and published
// as metrics. crash_after = N makes the process exit abruptly after N
// items, to test how dflow handles a plugin that dies.
//
// It is written as a plugin author would, on package sdk alone (its
// binary links no part of dflow's runtime or models), and tested in
// process with sdk/sdktest.
package main
