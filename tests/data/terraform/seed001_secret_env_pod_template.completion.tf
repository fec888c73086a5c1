# Completion of seed 001's "Setting sensitive environment variables" fragment
# (seed001_secret_env_pod_template.tf, verbatim): the pod template of a kubernetes runner. The test
# places the fragment, unchanged, in a `locals` block of this module; this file gives it its kubernetes
# runner with what the fragment leaves out: the cluster (client certificate authentication, its key a
# sensitive variable), the job's namespace and service account, the state storage.
variable "certificate_authority_data" {
  type = string
}

variable "client_certificate_data" {
  type = string
}

variable "client_key_data" {
  type      = string
  sensitive = true
}

resource "platform-orchestrator_kubernetes_runner" "this" {
  id          = "my-kubernetes-runner"
  description = "Kubernetes runner with a secret environment variable"
  runner_configuration = {
    cluster = {
      cluster_data = {
        certificate_authority_data = var.certificate_authority_data
        server                     = "https://kubernetes.example.com:6443"
      }
      auth = {
        client_certificate_data = var.client_certificate_data
        client_key_data         = var.client_key_data
      }
    }
    job = merge(local.runner_configuration.job, {
      namespace       = "platform-orchestrator-runner"
      service_account = "platform-orchestrator-runner"
    })
  }
  state_storage_configuration = {
    type = "kubernetes"
    kubernetes_configuration = {
      namespace = "platform-orchestrator-runner"
    }
  }
}

output "id" {
  value = platform-orchestrator_kubernetes_runner.this.id
}
