stage "source" {
  node = "synthetic_source"
  config {
    cont         = 4
    service_time = "lognormal(40ms)"
  }
}

stage "work" {
  node = "synthetic_work"
  config {
    service_time = "fast"
    speed        = [1, 0]
    sync         = "yes please"
    fail_after   = 1.5
  }
}

stage "sink" {
  node = "sink"
}

edge "a" {
  from = source.out
  to   = work.in
}

edge "b" {
  from = work.out
  to   = sink.in
}
