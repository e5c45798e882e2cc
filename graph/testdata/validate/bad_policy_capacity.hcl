stage "source" {
  node     = "synthetic_source"
  replicas = 0
  config {
    count = 4
  }
}

stage "sink" {
  node     = "sink"
  replicas = 2.5
}

edge "e" {
  from     = source.out
  to       = sink.in
  policy   = "round-robin"
  capacity = 0
}
