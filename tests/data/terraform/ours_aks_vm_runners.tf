# Not from the seeds: the two runner types that are ours (upstream has neither).
resource "platform-orchestrator_kubernetes_aks_runner" "aks" {
  id          = "my-aks-runner"
  description = "AKS runner with Azure workload identity"
  runner_configuration = {
    cluster = {
      name            = "my-aks-cluster"
      resource_group  = "my-resource-group"
      subscription_id = "00000000-0000-0000-0000-000000000001"
    }
    auth = {
      tenant_id = "00000000-0000-0000-0000-000000000002"
      client_id = "00000000-0000-0000-0000-000000000003"
    }
    job = {
      namespace       = "platform-orchestrator-runner"
      service_account = "platform-orchestrator-runner"
    }
  }
  state_storage_configuration = {
    type = "azurerm"
    azurerm_configuration = {
      storage_account_name = "mystateaccount"
      container_name       = "tfstate"
    }
  }
}

resource "platform-orchestrator_vm_runner" "vm" {
  id          = "my-vm-runner"
  description = "A machine reached over SSH"
  runner_configuration = {
    connection = {
      type            = "ssh"
      host            = "build-1.example.com"
      username        = "runner"
      host_public_key = var.ssh_host_public_key
      private_key     = var.ssh_private_key
    }
    job = {
      environment = {
        TF_IN_AUTOMATION = "1"
      }
    }
  }
  state_storage_configuration = {
    type = "orchestrator"
  }
}
