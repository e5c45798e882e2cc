stage "loop" {
  node = "synthetic_work"
}

edge "again" {
  from = loop.out
  to   = loop.in
}
