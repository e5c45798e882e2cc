stage "source" {
  node = "synthetic_source"
  config {
    count = 10
  }
}

stage "target" {
  node = "synthetic_work"
}

stage "sink" {
  node = "sink"
}

edge "tokens" {
  from = source.out
  to   = target.in
}

edge "hs" {
  from = targt.out
  to   = sink.in
}
