stage "source" {
  node = "synthetic_source"
  config {
    count = var.missing
  }
}

stage "sink" {
  node = "sink"
}

edge "e" {
  from = "source.out"
  to   = sink.in.extra
}
