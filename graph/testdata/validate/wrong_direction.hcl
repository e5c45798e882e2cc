stage "source" {
  node = "synthetic_source"
  config {
    count = 10
  }
}

stage "sink" {
  node = "sink"
}

edge "backwards" {
  from = sink.in
  to   = source.out
}
