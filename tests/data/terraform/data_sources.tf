# Not from the seeds: a data source of every runner type and of the rule, read back by id.
data "platform-orchestrator_kubernetes_gke_runner" "gke" {
  id = platform-orchestrator_kubernetes_gke_runner.my-gke-runner.id
}

data "platform-orchestrator_kubernetes_agent_runner" "agent" {
  id = platform-orchestrator_kubernetes_agent_runner.my_runner.id
}

data "platform-orchestrator_kubernetes_eks_runner" "eks" {
  id = module.seed000_custom_image_pod_template.id
  # A module's output is known at plan time: read after the module's runner exists.
  depends_on = [module.seed000_custom_image_pod_template]
}

data "platform-orchestrator_serverless_ecs_runner" "ecs" {
  id = module.seed000_ecs_custom_image.id
  # A module's output is known at plan time: read after the module's runner exists.
  depends_on = [module.seed000_ecs_custom_image]
}

data "platform-orchestrator_kubernetes_runner" "kubernetes" {
  id = module.seed001_secret_env_pod_template.id
  # A module's output is known at plan time: read after the module's runner exists.
  depends_on = [module.seed001_secret_env_pod_template]
}

data "platform-orchestrator_kubernetes_aks_runner" "aks" {
  id = platform-orchestrator_kubernetes_aks_runner.aks.id
}

data "platform-orchestrator_vm_runner" "vm" {
  id = platform-orchestrator_vm_runner.vm.id
}

data "platform-orchestrator_runner_rule" "gke" {
  id = platform-orchestrator_runner_rule.my-gke-runner-rule.id
}

output "read_back" {
  value = {
    gke_location      = data.platform-orchestrator_kubernetes_gke_runner.gke.runner_configuration.cluster.location
    agent_namespace   = data.platform-orchestrator_kubernetes_agent_runner.agent.runner_configuration.job.namespace
    eks_bucket        = data.platform-orchestrator_kubernetes_eks_runner.eks.state_storage_configuration.s3_configuration.bucket
    ecs_image         = data.platform-orchestrator_serverless_ecs_runner.ecs.runner_configuration.job.image
    kubernetes_server = data.platform-orchestrator_kubernetes_runner.kubernetes.runner_configuration.cluster.cluster_data.server
    aks_cluster       = data.platform-orchestrator_kubernetes_aks_runner.aks.runner_configuration.cluster.name
    vm_host           = data.platform-orchestrator_vm_runner.vm.runner_configuration.connection.host
    rule_runner       = data.platform-orchestrator_runner_rule.gke.runner_id
  }
}
