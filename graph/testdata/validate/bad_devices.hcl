stage "source" {
  node    = "synthetic_source"
  devices = ["gpu0"]
  config {
    count = 4
  }
  sim {
    service_time = "uniform(3ms, 1ms)"
  }
}

stage "sink" {
  node    = "sink"
  devices = []
}

edge "e" {
  from = source.out
  to   = sink.in
}
