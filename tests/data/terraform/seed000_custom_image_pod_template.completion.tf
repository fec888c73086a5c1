# Completion of seed 000's "Runner image" pod template fragment (seed000_custom_image_pod_template.tf,
# verbatim). The fragment is an argument of some runner's configuration: the test places it, unchanged,
# in a `locals` block of this module, and this file gives it a runner (any Kubernetes type; here EKS)
# with the fields the fragment leaves out: the job's namespace and service account, the cluster, the
# state storage.
resource "platform-orchestrator_kubernetes_eks_runner" "this" {
  id          = "my-eks-runner"
  description = "EKS runner pulling the runner image from my own registry"
  runner_configuration = {
    cluster = {
      name   = "my-eks-cluster"
      region = "eu-central-1"
      auth = {
        role_arn = "arn:aws:iam::123456789012:role/platform-orchestrator-runner"
      }
    }
    job = merge(local.runner_configuration.job, {
      namespace       = "platform-orchestrator-runner"
      service_account = "platform-orchestrator-runner"
    })
  }
  state_storage_configuration = {
    type = "s3"
    s3_configuration = {
      bucket      = "my-eks-runner-state"
      path_prefix = "states"
    }
  }
}

output "id" {
  value = platform-orchestrator_kubernetes_eks_runner.this.id
}
