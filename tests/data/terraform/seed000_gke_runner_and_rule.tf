resource "platform-orchestrator_kubernetes_gke_runner" "my-gke-runner" {
  id          = "my-gke-runner"
  description = "GKE runner for my-cluster in europe-west3"
  runner_configuration = {
    cluster = {
      name        = "my-cluster"
      project_id  = "my-gcp-project"
      location    = "europe-west3"
      internal_ip = false
      auth = {
        gcp_audience        = "//iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/my-wif-pool/providers/platform-orchestrator-runner"
        gcp_service_account = "platform-orchestrator-runner@my-gcp-project.iam.gserviceaccount.com"
      }
    }
    job = {
      namespace       = "platform-orchestrator-runner"
      service_account = "platform-orchestrator-runner"
    }
  }
  state_storage_configuration = {
    type = "kubernetes"
    kubernetes_configuration = {
      namespace = "platform-orchestrator-runner"
    }
  }
}

resource "platform-orchestrator_runner_rule" "my-gke-runner-rule" {
  runner_id  = platform-orchestrator_kubernetes_gke_runner.my-gke-runner.id
  project_id = "my-project"
}
