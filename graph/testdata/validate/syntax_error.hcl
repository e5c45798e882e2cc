stage "source" {
  node = "synthetic_source"
  config {
    count = 
  }
