stage "source" {
  node = "synthetic_source"
  config {
    count = 10
  }
}

stage "sink" {
  node = "sink"
}

edge "e" {
  from = source.output
  to   = sink.in
}
