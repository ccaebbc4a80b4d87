DROP INDEX `watermill_inbox_lease_until_idx` ON `watermill_inbox`;
