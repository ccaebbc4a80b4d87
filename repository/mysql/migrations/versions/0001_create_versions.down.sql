DROP TABLE IF EXISTS `watermill_versions`;
